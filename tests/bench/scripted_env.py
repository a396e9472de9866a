"""An environment for episode_bench.py: every episode takes exactly
--tool-turns round trips before it ends, whatever the model writes.

Each model turn before the last is answered with one "tool" observation
(the result of the turn's first tool call, or of an imagined one when the
model made none) after --tool-ms of simulated tool time; the turn after
--tool-turns round trips ends the episode (EPISODE_END_ENVIRONMENT,
reward 1). So the benchmark controls the number of environment round trips
per episode exactly, with the tiny model of tests/integration/
episode_model.py, whose own calls are not reliable enough to count on.

Serves through examples/python_environment/guess_number_env.py's serve()
(the same grpcio service registration as the example). Run by Debian's
/usr/bin/python3 (python3-grpcio, protoc):

    /usr/bin/python3 tests/bench/scripted_env.py --tool-turns 4 \
        --tool-ms 20 --ready-file /tmp/env.json
"""

import argparse
import os
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "examples", "python_environment"))
import guess_number_env as example  # noqa: E402

pb = example.pb
NAME = "scripted"


class Scripted:
    """The four Environment methods; `tool_turns` observations per
    episode, each after `tool_seconds`."""

    def __init__(self, tool_turns, tool_seconds):
        self.tool_turns = tool_turns
        self.tool_seconds = tool_seconds
        self.lock = threading.Lock()
        self.turns = {}  # episode id -> model turns answered

    def list_environments(self, request, context):
        return pb.ListEnvironmentsResponse(environments=[pb.EnvironmentInfo(
            name=NAME, description="A fixed number of tool round trips.")])

    def open_episode(self, request, context):
        episode_id = uuid.uuid4().hex
        with self.lock:
            self.turns[episode_id] = 0
        return pb.OpenEpisodeResponse(episode_id=episode_id,
                                      max_turns=self.tool_turns + 1)

    def step(self, request, context):
        with self.lock:
            turn = self.turns.get(request.episode_id)
            if turn is None:
                context.abort(example.grpc.StatusCode.NOT_FOUND,
                              "episode is not open here")
            self.turns[request.episode_id] = turn + 1
        reply = pb.StepResponse(turn=turn + 1)
        if turn >= self.tool_turns:
            reply.done = True
            reply.reward = 1.0
            reply.end_reason = pb.EPISODE_END_ENVIRONMENT
            reply.end_text = f"{self.tool_turns} tool round trips"
            return reply
        time.sleep(self.tool_seconds)
        calls = request.action.tool_calls
        reply.observations.add(
            role="tool", content="42",
            tool_call_id=calls[0].id if calls else f"call_{turn}",
            name=calls[0].name if calls else "calculator")
        return reply

    def close_episode(self, request, context):
        with self.lock:
            existed = self.turns.pop(request.episode_id, None) is not None
        return pb.CloseEpisodeResponse(existed=existed)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--address", default="127.0.0.1:0")
    parser.add_argument("--ready-file")
    parser.add_argument("--tool-turns", type=int, default=1)
    parser.add_argument("--tool-ms", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=1024,
                        help="server threads: each Step holds one for "
                             "--tool-ms, so at most threads / tool time "
                             "steps a second")
    args = parser.parse_args()
    example.serve(args.address, args.ready_file,
                  env=Scripted(args.tool_turns, args.tool_ms / 1000.0),
                  max_workers=args.threads)


if __name__ == "__main__":
    main()
