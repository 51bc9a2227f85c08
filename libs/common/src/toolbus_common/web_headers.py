"""The security headers every page toolbus serves to a browser carries (the approvals console,
the credentials service's OAuth pages): a content security policy allowing only the server's own
files, no framing, no content sniffing, no referrer, no caching."""

from __future__ import annotations

SECURITY_HEADERS: dict[str, str] = {
    "content-security-policy": "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}
