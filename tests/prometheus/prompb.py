"""The prometheus.WriteRequest messages built with the protobuf library itself (from a
descriptor, no generated code): an independent reference the hand-written decoder and
encoder in collector/remote_write/wire.py are checked against."""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto


def _messages() -> dict[str, type]:
    fd = descriptor_pb2.FileDescriptorProto(name="gpufleet_test_prompb.proto", package="prometheus", syntax="proto3")

    def msg(name: str, fields: list[tuple[str, int, int, int, str]]) -> None:
        m = fd.message_type.add(name=name)
        for fname, number, ftype, label, tname in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if tname:
                f.type_name = tname

    opt, rep = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
    msg("Label", [("name", 1, _F.TYPE_STRING, opt, ""), ("value", 2, _F.TYPE_STRING, opt, "")])
    msg("Sample", [("value", 1, _F.TYPE_DOUBLE, opt, ""), ("timestamp", 2, _F.TYPE_INT64, opt, "")])
    msg("TimeSeries", [("labels", 1, _F.TYPE_MESSAGE, rep, ".prometheus.Label"),
                       ("samples", 2, _F.TYPE_MESSAGE, rep, ".prometheus.Sample")])
    msg("MetricMetadata", [("type", 1, _F.TYPE_INT32, opt, ""), ("metric_family_name", 2, _F.TYPE_STRING, opt, ""),
                           ("help", 4, _F.TYPE_STRING, opt, ""), ("unit", 5, _F.TYPE_STRING, opt, "")])
    msg("WriteRequest", [("timeseries", 1, _F.TYPE_MESSAGE, rep, ".prometheus.TimeSeries"),
                         ("metadata", 3, _F.TYPE_MESSAGE, rep, ".prometheus.MetricMetadata")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"prometheus.{n}"))
            for n in ("Label", "Sample", "TimeSeries", "MetricMetadata", "WriteRequest")}


MESSAGES = _messages()
WriteRequest = MESSAGES["WriteRequest"]
