"""Allowed values and defaults of the options several layers share, spelled in one place. Standard library only."""

POOLINGS = ("cls", "mean", "first-last")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
SCHEDULES = ("constant", "linear")
PACKING_MODES = ("auto", "on", "grouped", "off")  # --packing (encoder/packing.py)
MASK_UNITS = ("char", "token")
LOSSES = ("infonce", "ms")
# encode --quantize / search --quantize (search/quantized.py); search has no uint8 (docs/design.md)
ENCODE_QUANTIZATIONS = ("float32", "int8", "uint8", "binary", "ubinary")
SEARCH_QUANTIZATIONS = ("float32", "int8", "ubinary")
INDEX_TYPES = ("auto", "exact", "ivf")  # `index --index-type` (search/approximate.py)
AUTO_IVF_ROWS = 100_000  # --index-type auto: exact below this many rows, ivf from there on
DEFAULT_MODEL = "bert-base-uncased"
# mirrorbert export (encoder/export.py): the serving formats, in the folder layout sentence-transformers' backends read
EXPORT_FORMATS = ("onnx", "openvino")
DEFAULT_ONNX_OPSET = 18  # torch.onnx's exporter default; onnxruntime >= 1.14 and OpenVINO read it
EXPORT_MIN_COSINE = 0.9999  # an export whose vectors fall below this cosine to PyTorch's is not written
