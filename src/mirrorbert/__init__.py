"""Mirror-BERT: self-supervised conversion of masked language models into universal encoders."""

from mirrorbert._version import __version__

__all__ = ["Encoder", "TrainConfig", "strings_from_dataset", "train", "__version__"]


def __getattr__(name):
    # Lazy so that `import mirrorbert` stays cheap (no torch import) for the CLI's --help.
    if name == "Encoder":
        from mirrorbert.encoder.model import Encoder

        return Encoder
    if name == "TrainConfig":
        from mirrorbert.mirror.config import TrainConfig

        return TrainConfig
    if name == "train":
        from mirrorbert.mirror.train import train

        return train
    if name == "strings_from_dataset":
        from mirrorbert.data.strings import strings_from_dataset

        return strings_from_dataset
    raise AttributeError(name)
