"""The baseline fusion modes: full prefill, prefix caching, full reuse and EPIC."""
