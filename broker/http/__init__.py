"""The HTTP edge: app factory, thin handlers, request schemas, the error envelope, SSE."""
