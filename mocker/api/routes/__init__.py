"""The HTTP routes, one router per job: OpenAI, tokenizer, operations, admin."""
