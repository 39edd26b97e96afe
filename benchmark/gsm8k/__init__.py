"""GSM8K few-shot accuracy client and the DSpark x DP validation matrix."""
