"""``python -m chaoslib_infer.cli``: the ``chaos-infer`` command line."""

from chaoslib_infer.cli import main

if __name__ == "__main__":
    main()
