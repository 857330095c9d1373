"""Schemas as the engine needs them, found from what grpcio code has.

A servicer registered through grpcio's generated ``add_XServicer_to_server``
names its service and its methods; the service's ``.proto`` declaration is
in protobuf's default descriptor pool once the ``*_pb2`` module is imported
(the ``*_pb2_grpc`` module imports it). The engine gets that file and every
file it imports as a serialized ``FileDescriptorSet``: it builds its tables
from them (by digest, once), so the Python process needs no ``.proto`` file
and no protoplane code generation.
"""

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_classes = {}


def descriptor_set(service_name):
    """The serialized FileDescriptorSet declaring `service_name`, imports first."""
    pool = descriptor_pool.Default()
    try:
        service = pool.FindServiceByName(service_name)
    except KeyError:
        raise LookupError(
            f"service {service_name} is not in protobuf's descriptor pool: import the "
            f"*_pb2 module that declares it before serving"
        ) from None
    files, seen = [], set()

    def visit(fd):
        if fd.name in seen:
            return
        seen.add(fd.name)
        for dep in fd.dependencies:
            visit(dep)
        files.append(descriptor_pb2.FileDescriptorProto.FromString(fd.serialized_pb))

    visit(service.file)
    return descriptor_pb2.FileDescriptorSet(file=files).SerializeToString()


def message_class(full_name):
    """The generated message class of a message type, by full name."""
    cls = _classes.get(full_name)
    if cls is None:
        desc = descriptor_pool.Default().FindMessageTypeByName(full_name)
        cls = message_factory.GetMessageClass(desc)
        _classes[full_name] = cls
    return cls


def to_pb2(view):
    """A `*_pb2` message with the contents of a request view (a copy that
    outlives the call)."""
    return message_class(view.type_name).FromString(view.SerializeToString())
