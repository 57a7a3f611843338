"""The paper's experiments re-run at a small scale: ``transduce study table3`` (Table 3's variations).

:mod:`.table3` holds the rows and the paper's figures, :mod:`.sweep` runs them (one process per row and
seed, resumable), :mod:`.row` is that process, :mod:`.report` writes the table and the plots.
"""
