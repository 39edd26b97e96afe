"""GSM8K few-shot accuracy client and the DSpark x DP validation matrix.

``client`` is the GSM8K client (standard library only). The matrix is split by
concern: ``config`` (the TOML file), ``supervision`` (server processes),
``measurement`` (the numbers), ``reporting`` (result files, table, plot), and
``matrix``, its command line.
"""
