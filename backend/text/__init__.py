"""Text in and out of the engine: tokenizer, chat template, detokenizer, output parsers."""
