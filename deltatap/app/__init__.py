"""The application shell: the ``deltatap`` console script (``cli``), ``deltatap demo`` (``demo``) and the
generated reference page (``refdoc``). The top floor: it may import every package below it.
"""
