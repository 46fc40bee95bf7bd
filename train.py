"""Entry point: ``python train.py key=value ...`` (Hydra). All logic lives in the package."""

from xtransformer.cli import train_main

if __name__ == "__main__":
    train_main()
