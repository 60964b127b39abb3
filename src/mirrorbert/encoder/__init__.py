"""The encoder: a Hugging Face model + tokenizer + pooling, how batches run through it, and what it is saved as.

Modules: `source` (where every model comes in: `open_model` checks it once and returns the handle every loader
takes), `architectures` (what some types need: preparation, precision, fixed lengths), `model` (`Encoder`: load,
encode, save), `pooling`, `batching` (padding), `packing` (packed
rows with block-diagonal attention, length groups), `dropout` (dropout rates and DropHead), `masked_lm` (a
masked LM's own head: span positions and forward passes), `streaming` (encode into a .npy on disk),
`sharded` (under torchrun, each process its own rows of that .npy),
`export` (ONNX and OpenVINO).
"""


def __getattr__(name):
    # Lazy, so that importing `mirrorbert.encoder.pooling` does not import the whole Encoder.
    if name == "Encoder":
        from mirrorbert.encoder.model import Encoder

        return Encoder
    raise AttributeError(name)
