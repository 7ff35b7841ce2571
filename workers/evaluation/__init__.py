"""Quality and TTFT evaluation of the fusion modes on multi-document QA data."""
