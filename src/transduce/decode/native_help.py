"""The ``--native`` option's help, shared by ``translate``, ``evaluate`` and ``serve``.

Its own module so the command lines can import it without importing torch's C++ extension tools.
"""

NATIVE_HELP = (
    "run decoding in C++ (built on first use): fp32/bf16 run each decoder step as one call with "
    "unchanged output; int8 also runs the encoder, the step and beam search's candidate selection "
    "in int8 kernels and loops (faster, and independent of the batch)"
)
