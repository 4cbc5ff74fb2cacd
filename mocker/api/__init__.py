"""The OpenAI-compatible HTTP server: protocol models, routes, streaming and errors."""
