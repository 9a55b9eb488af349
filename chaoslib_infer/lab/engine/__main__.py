"""``python -m chaoslib_infer.lab.engine``: run one simulated engine replica (see ``--help``)."""

from chaoslib_infer.lab.engine.command import main

if __name__ == "__main__":
    main()
