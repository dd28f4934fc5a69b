"""The recipe's prompt set: calibration prompts (varied language, length, punctuation, speakers) and
held-out prompts used only for parity. Texts are data; tokenised with the checkpoint's tokenizer."""

CALIBRATION = [
    {"text": "Hello, and welcome to the quarterly review. Let's begin with the numbers.", "language": "english"},
    {"text": "The quick brown fox jumps over the lazy dog.", "language": "english"},
    {"text": "Turn left in two hundred meters, then keep right at the fork.", "language": "english"},
    {"text": "Your meeting with Dr. Alvarez starts at 3:45 PM.", "language": "english"},
    {"text": "Wait... are you sure? I thought we agreed on Tuesday!", "language": "english"},
    {"text": "Rain is expected tonight, with temperatures falling to four degrees.", "language": "auto"},
    {"text": "今天天气很好，我们去公园散步吧。", "language": "chinese"},
    {"text": "请在下一个路口左转，然后直行五百米。", "language": "chinese"},
    {"text": "Guten Morgen! Der Zug nach Berlin hat zehn Minuten Verspätung.", "language": "german"},
    {"text": "Bonjour, je voudrais réserver une table pour deux personnes.", "language": "french"},
    {"text": "¿Dónde está la estación de tren más cercana?", "language": "spanish"},
    {"text": "こんにちは、今日はいい天気ですね。", "language": "japanese"},
    {"text": "Battery at fifteen percent. Connect your charger.", "language": "english"},
    {"text": "One, two, three, four, five, six, seven, eight, nine, ten.", "language": "english"},
    {"text": "She sells seashells by the seashore; the shells she sells are surely seashells.", "language": "english"},
    {"text": "Ok.", "language": "english"},
    {"text": "Please hold while I transfer your call to the billing department.", "language": "auto",
     "non_streaming": False},
    {"text": "In 1969, humans first walked on the Moon.", "language": "english", "non_streaming": False},
]

HELDOUT = [
    {"text": "Thanks for calling. How can I help you today?", "language": "english"},
    {"text": "明天早上八点叫我起床。", "language": "chinese"},
]
