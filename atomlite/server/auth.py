"""The API key check: `Authorization: Bearer KEY`, the scheme in any case (RFC 7235), the key compared in constant
time so its bytes cannot be guessed one at a time from response times."""
import hmac


def api_key_matches(authorization: str | None, api_key: str) -> bool:
    scheme, _, given = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode("utf-8", "surrogateescape"), api_key.encode("utf-8"))
