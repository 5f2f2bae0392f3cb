"""Splitwise (disaggregated prefill/decode) serving."""
