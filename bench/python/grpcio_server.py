"""grpcio's own servers for `protoplane bench python`: the social-network
servicer of social_servicer.py on `grpc.aio` (async handlers) or on the
thread-pool `grpc.server` (sync handlers). Prints `listening on HOST:PORT`.

    python grpcio_server.py --mode aio|sync [--port 0] [--workers N]
"""

import argparse
import asyncio
import sys
from concurrent import futures

import grpc

import social_network_pb2_grpc as pb_grpc
import social_servicer


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("aio", "sync"), default="aio")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--workers", type=int, default=16)
    a = p.parse_args()
    if a.mode == "sync":
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=a.workers))
        pb_grpc.add_SocialNetworkServicer_to_server(social_servicer.SocialNetwork(), server)
        port = server.add_insecure_port(f"127.0.0.1:{a.port}")
        server.start()
        print(f"listening on 127.0.0.1:{port}", flush=True)
        server.wait_for_termination()
        return

    async def serve():
        server = grpc.aio.server()
        pb_grpc.add_SocialNetworkServicer_to_server(social_servicer.AsyncSocialNetwork(), server)
        port = server.add_insecure_port(f"127.0.0.1:{a.port}")
        await server.start()
        print(f"listening on 127.0.0.1:{port}", flush=True)
        await server.wait_for_termination()

    asyncio.run(serve())


if __name__ == "__main__":
    sys.exit(main())
