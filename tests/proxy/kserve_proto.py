"""KServe v2 inference messages built with the protobuf library itself (a descriptor assembled at run time from the
fields of grpc_service.proto that the tests use): the encoder the gRPC observer's hand-written reader is checked
against, independent of it."""

from __future__ import annotations

import struct

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"


def _field(msg, name, number, ftype, label=_F.LABEL_OPTIONAL, type_name=None, oneof=None):
    f = msg.field.add(name=name, number=number, type=ftype, label=label)
    if type_name:
        f.type_name = type_name
    if oneof is not None:
        f.oneof_index = oneof
    return f


def _build():
    fd = descriptor_pb2.FileDescriptorProto(name="deltatap_test_kserve.proto", package="inference", syntax="proto3")
    p = fd.message_type.add(name="InferParameter")
    p.oneof_decl.add(name="parameter_choice")
    _field(p, "bool_param", 1, _F.TYPE_BOOL, oneof=0)
    _field(p, "int64_param", 2, _F.TYPE_INT64, oneof=0)
    _field(p, "string_param", 3, _F.TYPE_STRING, oneof=0)
    c = fd.message_type.add(name="InferTensorContents")
    _field(c, "int_contents", 2, _F.TYPE_INT32, _F.LABEL_REPEATED)
    _field(c, "fp32_contents", 6, _F.TYPE_FLOAT, _F.LABEL_REPEATED)
    _field(c, "bytes_contents", 8, _F.TYPE_BYTES, _F.LABEL_REPEATED)
    r = fd.message_type.add(name="ModelInferResponse")
    entry = r.nested_type.add(name="ParametersEntry")
    entry.options.map_entry = True
    _field(entry, "key", 1, _F.TYPE_STRING)
    _field(entry, "value", 2, _F.TYPE_MESSAGE, type_name=".inference.InferParameter")
    o = r.nested_type.add(name="InferOutputTensor")
    _field(o, "name", 1, _F.TYPE_STRING)
    _field(o, "datatype", 2, _F.TYPE_STRING)
    _field(o, "shape", 3, _F.TYPE_INT64, _F.LABEL_REPEATED)
    _field(o, "contents", 5, _F.TYPE_MESSAGE, type_name=".inference.InferTensorContents")
    _field(r, "model_name", 1, _F.TYPE_STRING)
    _field(r, "model_version", 2, _F.TYPE_STRING)
    _field(r, "id", 3, _F.TYPE_STRING)
    _field(r, "parameters", 4, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, ".inference.ModelInferResponse.ParametersEntry")
    _field(r, "outputs", 5, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, ".inference.ModelInferResponse.InferOutputTensor")
    _field(r, "raw_output_contents", 6, _F.TYPE_BYTES, _F.LABEL_REPEATED)
    s = fd.message_type.add(name="ModelStreamInferResponse")
    _field(s, "error_message", 1, _F.TYPE_STRING)
    _field(s, "infer_response", 2, _F.TYPE_MESSAGE, type_name=".inference.ModelInferResponse")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    get = lambda name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"inference.{name}"))  # noqa: E731
    return get("ModelInferResponse"), get("ModelStreamInferResponse")


ModelInferResponse, ModelStreamInferResponse = _build()
STREAM_INFER = _STREAM_INFER


def raw_bytes_tensor(*elements: bytes) -> bytes:
    """A BYTES tensor serialised for raw_output_contents: each element a 4-byte little-endian length and its bytes."""
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def stream_response(text: str | None, *, raw: bool = True, final: bool = False, model: str = "llm", rid: str = "r1",
                    error: str = "", extra_fp32: bool = True) -> bytes:
    """One serialised ModelStreamInferResponse carrying ``text`` as the ``text_output`` BYTES tensor (raw or in
    contents), optionally beside an FP32 output before it and Triton's ``triton_final_response`` parameter."""
    r = ModelInferResponse(model_name=model, model_version="1", id=rid)
    if extra_fp32:
        t = r.outputs.add(name="logprob", datatype="FP32", shape=[1])
        if raw:
            r.raw_output_contents.append(struct.pack("<f", -0.5))
        else:
            t.contents.fp32_contents.append(-0.5)
    if text is not None:
        t = r.outputs.add(name="text_output", datatype="BYTES", shape=[1])
        if raw:
            r.raw_output_contents.append(raw_bytes_tensor(text.encode()))
        else:
            t.contents.bytes_contents.append(text.encode())
    r.parameters["triton_final_response"].bool_param = final
    return ModelStreamInferResponse(error_message=error, infer_response=r).SerializeToString()


def frame(message: bytes, compressed: bool = False) -> bytes:
    """One gRPC Length-Prefixed-Message."""
    return bytes([1 if compressed else 0]) + struct.pack(">I", len(message)) + message
