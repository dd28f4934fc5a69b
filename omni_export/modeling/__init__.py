"""Model parts shared by the recipes (audio files, norms, RoPE tables). Knows no recipe."""
