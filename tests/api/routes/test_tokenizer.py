"""Tokenizer routes: /tokenize counts as a client does, /detokenize inverts it."""

from __future__ import annotations

from tests.support.servers import AppClient, tokenizer


async def test_tokenize_matches_the_client_count_and_detokenize_inverts(
    client: AppClient,
) -> None:
    text = "The quick brown fox jumps over the lazy dog, 12345 times!"
    r = await client.http.post("/tokenize", json={"prompt": text})
    body = r.json()
    assert body["tokens"] == tokenizer().encode(text)
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 4096
    r = await client.http.post("/detokenize", json={"tokens": body["tokens"]})
    assert r.json() == {"prompt": text}
    r = await client.http.post("/tokenize", json={"messages": [{"role": "user", "content": text}]})
    assert r.json()["count"] == len(tokenizer().encode(text))  # the plain fallback template
