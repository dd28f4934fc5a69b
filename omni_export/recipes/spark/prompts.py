"""The recipe's prompt set: calibration prompts (quantizer ranges come from the fp32 activations
these produce) and held-out prompts (parity only; never calibrated on). Tokenised with the
checkpoint's own tokenizer. Agentic-assistant flavoured, as the model is used on device."""

CALIBRATION = (
    "Summarise the following meeting notes in three bullet points: the budget was approved, the launch moved to May.",
    "You are a helpful assistant. The user asks: what is the capital of Australia, and why is it not Sydney?",
    "Write a Python function that returns the n-th Fibonacci number using iteration instead of recursion.",
    "Translate into French: The train to Lyon leaves at nine and arrives shortly after noon.",
    "Plan a three-day trip to Kyoto for a family with two children who like trains and temples.",
    "Call the weather tool for Berlin tomorrow, then tell me whether I need an umbrella.",
    "Explain in simple words how a heat pump can move heat from a cold garden into a warm house.",
    "List five ways to reduce the memory used by a neural network on a mobile phone.",
    "The invoice total is 1,284.50 euros including 19% VAT. What is the net amount?",
    "Draft a polite email asking a colleague to review the pull request before Friday.",
    "Set an alarm for 6:45 tomorrow and add 'buy milk' to my shopping list.",
    "What are the main differences between a process and a thread in an operating system?",
    "Give a short story opening about a lighthouse keeper who finds a message in a bottle.",
    "Convert this JSON to YAML: {\"name\": \"spark\", \"layers\": 28, \"window\": 512}",
    "Why does the sky look red at sunset? Answer in two sentences.",
    "Search my notes for 'quarterly review' and show the three most recent results.",
)

HELDOUT = (
    "Book a table for four at an Italian restaurant near the station at eight tonight, and text me the address.",
    "Explain what a sliding-window attention layer does and why it saves memory on long inputs.",
    "Write a haiku about autumn leaves falling on a quiet river in the evening light.",
    "How many minutes are there in a week? Show the calculation step by step.",
)
