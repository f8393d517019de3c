"""Text to tokens as llama.cpp's tools do it: text rules, tokenizers, and counting a large
corpus on several workers."""
