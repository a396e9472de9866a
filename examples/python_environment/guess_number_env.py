"""A Tandem environment written in Python: guess the number.

Implements the tandem.v1.Environment gRPC service (proto/tandem/v1/
environment.proto) with grpcio, to show that an environment can be any
process in any language. The message classes are generated at start-up
with protoc into a temporary directory (nothing generated is committed);
the service is registered with grpcio's generic handlers, so grpc_tools is
not needed.

The game: the environment holds a secret integer in [1, 100] (the task's
metadata "secret" if given, else derived from the task id). The model calls
the tool guess(number); each call is answered "higher", "lower" or
"correct". A correct guess ends the episode (EPISODE_END_ENVIRONMENT) with
reward 1 / number_of_guesses; a turn without a tool call gets a user turn
reminding the model to use the tool; after MAX_TURNS turns the episode
ends (EPISODE_END_MAX_TURNS, no reward). Bad arguments are answered in the
tool observation, not as RPC errors.

With --opening, OpenEpisode answers like a gym reset(): a first user
observation, "I am thinking of a number between LO and HI.", a window
drawn at random around the secret, so that each episode of a group (the
same task) opens differently. The rollout worker renders it after the
prompt and before the model's first turn; the task's prompt is then
written without the chat template's generation header
(docs/environments.md, "Opening observations").

Run (Debian's python3-grpcio and protoc, as the integration tests use):

    /usr/bin/python3 examples/python_environment/guess_number_env.py \
        --address 127.0.0.1:50070

It prints one line "listening on HOST:PORT" and, with --ready-file, writes
{"grpc_address": "HOST:PORT"} there. Stop it with SIGTERM or Ctrl-C.
"""

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from concurrent import futures

import grpc

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def load_messages():
    """Generates environment_pb2 with protoc into a temp dir; imports it."""
    out = tempfile.mkdtemp(prefix="tandem-env-pb-")
    proto_dir = os.path.join(REPO, "proto")
    subprocess.run(
        ["protoc", f"--proto_path={proto_dir}", f"--python_out={out}",
         os.path.join(proto_dir, "tandem", "v1", "environment.proto")],
        check=True)
    sys.path.insert(0, out)
    from tandem.v1 import environment_pb2
    return environment_pb2


pb = load_messages()

NAME = "guess_number"
MAX_TURNS = 12
MAX_OPEN = 256
TOOLS = [{
    "type": "function",
    "function": {
        "name": "guess",
        "description": "Guess the secret integer between 1 and 100; the "
                       "answer is higher, lower or correct.",
        "parameters": {
            "type": "object",
            "properties": {"number": {"type": "integer",
                                      "description": "Your guess."}},
            "required": ["number"],
        },
    },
}]


class Episode:
    def __init__(self, secret):
        self.secret = secret
        self.turns = 0
        self.guesses = 0
        self.ended = False


class GuessNumber:
    """The service's four methods over a dict of episodes."""

    def __init__(self, opening=False):
        self.lock = threading.Lock()
        self.episodes = {}
        self.opening = opening
        self.random = random.Random()

    def list_environments(self, request, context):
        return pb.ListEnvironmentsResponse(environments=[pb.EnvironmentInfo(
            name=NAME, description="Guess a number in [1, 100] with a tool.",
            tools_json=json.dumps(TOOLS))])

    def open_episode(self, request, context):
        if request.environment != NAME:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"environment: unknown environment "
                          f"'{request.environment[:64]}' (known: {NAME})")
        secret = request.metadata.get("secret")
        if secret is not None:
            if not secret.isdigit() or not 1 <= int(secret) <= 100:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              "metadata.secret must be an integer in [1, 100]")
            secret = int(secret)
        else:
            digest = hashlib.sha256(request.task_id.encode()).digest()
            secret = 1 + int.from_bytes(digest[:4], "big") % 100
        with self.lock:
            if len(self.episodes) >= MAX_OPEN:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"{MAX_OPEN} episodes are open")
            episode_id = uuid.uuid4().hex
            self.episodes[episode_id] = Episode(secret)
            low = max(1, secret - self.random.randint(0, 30))
            high = min(100, secret + self.random.randint(0, 30))
        reply = pb.OpenEpisodeResponse(
            episode_id=episode_id, tools_json=json.dumps(TOOLS),
            max_turns=MAX_TURNS)
        if self.opening:
            reply.observations.add(
                role="user", content=f"I am thinking of a number between "
                                     f"{low} and {high}.")
        return reply

    def step(self, request, context):
        with self.lock:
            episode = self.episodes.get(request.episode_id)
            if episode is None:
                context.abort(grpc.StatusCode.NOT_FOUND,
                              "episode is not open here")
            if episode.ended:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              "the episode has ended; close it")
            episode.turns += 1
            reply = pb.StepResponse(turn=episode.turns)
            calls = request.action.tool_calls
            if not calls:
                reply.observations.add(
                    role="user",
                    content="Use the guess tool to guess the number.")
            for call in calls:
                content = self.answer(episode, call)
                reply.observations.add(role="tool", content=content,
                                       tool_call_id=call.id, name=call.name)
                if episode.ended:
                    reply.done = True
                    reply.reward = 1.0 / episode.guesses
                    reply.end_reason = pb.EPISODE_END_ENVIRONMENT
                    reply.end_text = (f"guessed {episode.secret} in "
                                      f"{episode.guesses} guesses")
                    break
            if not reply.done and episode.turns >= MAX_TURNS:
                episode.ended = True
                reply.done = True
                reply.end_reason = pb.EPISODE_END_MAX_TURNS
                reply.end_text = f"{MAX_TURNS} turns without the number"
            return reply

    @staticmethod
    def answer(episode, call):
        """The tool observation of one call; ends the episode when right."""
        if call.name != "guess":
            return f"error: unknown tool '{call.name[:64]}'; use guess"
        try:
            args = json.loads(call.arguments_json)
            number = args["number"]
            if isinstance(number, str):
                number = int(number)
            if not isinstance(number, int) or isinstance(number, bool):
                raise ValueError
        except (ValueError, KeyError, TypeError):
            return ('error: arguments must be a JSON object like '
                    '{"number": 50}')
        episode.guesses += 1
        if number < episode.secret:
            return "higher"
        if number > episode.secret:
            return "lower"
        episode.ended = True
        return "correct"

    def close_episode(self, request, context):
        with self.lock:
            existed = self.episodes.pop(request.episode_id, None) is not None
        return pb.CloseEpisodeResponse(existed=existed)


def serve(address, ready_file=None, env=None, max_workers=8):
    """Serves `env` (default GuessNumber(); any object with the four
    methods) on `address` until SIGTERM or Ctrl-C."""
    env = env or GuessNumber()

    def handler(method, request_class, response_class):
        return grpc.unary_unary_rpc_method_handler(
            method, request_deserializer=request_class.FromString,
            response_serializer=response_class.SerializeToString)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "tandem.v1.Environment", {
            "ListEnvironments": handler(env.list_environments,
                                        pb.ListEnvironmentsRequest,
                                        pb.ListEnvironmentsResponse),
            "OpenEpisode": handler(env.open_episode, pb.OpenEpisodeRequest,
                                   pb.OpenEpisodeResponse),
            "Step": handler(env.step, pb.StepRequest, pb.StepResponse),
            "CloseEpisode": handler(env.close_episode,
                                    pb.CloseEpisodeRequest,
                                    pb.CloseEpisodeResponse),
        })])
    host = address.rsplit(":", 1)[0]
    port = server.add_insecure_port(address)
    server.start()
    bound = f"{host}:{port}"
    print(f"listening on {bound}", flush=True)
    if ready_file:
        with open(ready_file + ".tmp", "w") as f:
            json.dump({"grpc_address": bound}, f)
        os.replace(ready_file + ".tmp", ready_file)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    server.stop(grace=2).wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--address", default="127.0.0.1:0",
                        help="host:port to listen on (port 0: any free one)")
    parser.add_argument("--ready-file",
                        help="write {\"grpc_address\": ...} here once serving")
    parser.add_argument("--opening", action="store_true",
                        help="open each episode with a first observation "
                             "(a random window around the secret)")
    args = parser.parse_args()
    serve(args.address, args.ready_file, GuessNumber(opening=args.opening))


if __name__ == "__main__":
    main()
