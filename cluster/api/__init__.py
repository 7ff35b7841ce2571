"""The HTTP edge: request and response models, the response writer, callers, tenants."""
