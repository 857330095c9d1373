"""The social-network service's handlers, written once as grpcio servicers
(sync and async): what `protoplane bench python` serves with grpcio's own
servers and with the protoplane engine. They do what the Rust handlers of
`protoplane serve` do (crates/load/src/social): read the request's
`req_id`, answer the default reply, and for Login a token of the id and the
user name, so the comparison measures the RPC stacks, not business logic.

The pb2 modules are generated from protos/socialnetwork/social_network.proto
by the harness (grpcio-tools' protoc) into its work directory."""

import social_network_pb2 as pb
import social_network_pb2_grpc as pb_grpc

_EMPTY = pb.Empty()


def _empty(request, context):
    request.req_id  # every handler reads the request, as the Rust ones do
    return _EMPTY


def _login(request, context):
    return pb.LoginReply(token=f"t{request.req_id}-{request.username}")


class SocialNetwork(pb_grpc.SocialNetworkServicer):
    def RegisterUser(self, request, context):
        return _empty(request, context)

    def Login(self, request, context):
        return _login(request, context)

    def ComposeMedia(self, request, context):
        return _empty(request, context)

    def ComposePost(self, request, context):
        return _empty(request, context)

    def StorePost(self, request, context):
        return _empty(request, context)


class AsyncSocialNetwork(pb_grpc.SocialNetworkServicer):
    async def RegisterUser(self, request, context):
        return _empty(request, context)

    async def Login(self, request, context):
        return _login(request, context)

    async def ComposeMedia(self, request, context):
        return _empty(request, context)

    async def ComposePost(self, request, context):
        return _empty(request, context)

    async def StorePost(self, request, context):
        return _empty(request, context)
