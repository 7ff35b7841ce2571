"""From prompt to text: prompt layout, sampling, decoding and text streaming."""
