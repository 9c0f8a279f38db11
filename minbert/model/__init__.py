"""The encoder (BERT), its tokenizer and its weights (reading a checkpoint, the packaged MiniLM,
conversion to and from Hugging Face names). Imports only minbert.core."""
