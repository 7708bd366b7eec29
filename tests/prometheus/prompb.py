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


def _messages_v2() -> dict[str, type]:
    """``io.prometheus.write.v2`` as the spec's types.proto declares it (field numbers and
    types; the native histogram cut to a few of its fields: the receiver only counts them)."""
    pkg = "io.prometheus.write.v2"
    fd = descriptor_pb2.FileDescriptorProto(name="gpufleet_test_prompb_v2.proto", package=pkg, syntax="proto3")

    def msg(name: str, fields: list[tuple[str, int, int, int, str]]) -> None:
        m = fd.message_type.add(name=name)
        for fname, number, ftype, label, tname in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if tname:
                f.type_name = f".{pkg}.{tname}"

    opt, rep = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
    msg("Sample", [("value", 1, _F.TYPE_DOUBLE, opt, ""), ("timestamp", 2, _F.TYPE_INT64, opt, ""),
                   ("start_timestamp", 3, _F.TYPE_INT64, opt, "")])
    msg("Exemplar", [("labels_refs", 1, _F.TYPE_UINT32, rep, ""), ("value", 2, _F.TYPE_DOUBLE, opt, ""),
                     ("timestamp", 3, _F.TYPE_INT64, opt, "")])
    msg("Histogram", [("count_int", 1, _F.TYPE_UINT64, opt, ""), ("sum", 3, _F.TYPE_DOUBLE, opt, ""),
                      ("schema", 4, _F.TYPE_SINT32, opt, ""), ("timestamp", 15, _F.TYPE_INT64, opt, "")])
    msg("Metadata", [("type", 1, _F.TYPE_INT32, opt, ""), ("help_ref", 3, _F.TYPE_UINT32, opt, ""),
                     ("unit_ref", 4, _F.TYPE_UINT32, opt, "")])
    msg("TimeSeries", [("labels_refs", 1, _F.TYPE_UINT32, rep, ""), ("samples", 2, _F.TYPE_MESSAGE, rep, "Sample"),
                       ("histograms", 3, _F.TYPE_MESSAGE, rep, "Histogram"),
                       ("exemplars", 4, _F.TYPE_MESSAGE, rep, "Exemplar"),
                       ("metadata", 5, _F.TYPE_MESSAGE, opt, "Metadata"),
                       ("created_timestamp", 6, _F.TYPE_INT64, opt, "")])
    msg("Request", [("symbols", 4, _F.TYPE_STRING, rep, ""), ("timeseries", 5, _F.TYPE_MESSAGE, rep, "TimeSeries")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{pkg}.{n}"))
            for n in ("Sample", "Exemplar", "Histogram", "Metadata", "TimeSeries", "Request")}


V2 = _messages_v2()
COUNTER_V2 = 1  # Metadata.MetricType.METRIC_TYPE_COUNTER
GAUGE_V2 = 2


def request_v2(series: list[tuple[dict[str, str], list[tuple[int, float]]]],
               types: dict[str, int] | None = None) -> bytes:
    """An uncompressed ``io.prometheus.write.v2.Request`` of (labels, [(ts ms, value)]) as the
    protobuf library writes it: symbols interned in first-seen order after the required empty
    string, labels sorted by name, each series' metadata type from ``types`` by its name."""
    symbols = [""]
    index = {"": 0}

    def ref(s: str) -> int:
        if s not in index:
            index[s] = len(symbols)
            symbols.append(s)
        return index[s]

    req = V2["Request"]()
    for labels, samples in series:
        ts = req.timeseries.add()
        for name, value in sorted(labels.items()):
            ts.labels_refs.extend([ref(name), ref(value)])
        for t, v in samples:
            ts.samples.add(value=v, timestamp=t)
        kind = (types or {}).get(labels.get("__name__", ""), 0)
        if kind:
            ts.metadata.type = kind
    req.symbols.extend(symbols)
    return req.SerializeToString()
