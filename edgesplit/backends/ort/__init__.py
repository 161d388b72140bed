"""ONNX Runtime as a backend: profiling nodes and parts, quantized profiling, the compiler (an ONNX
part as is) and the executor."""
