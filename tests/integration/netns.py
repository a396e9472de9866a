"""Network namespaces on one Linux bridge: the way Tandem's daemons sit on
separate nodes of one LAN, on one machine. Needs root, iproute2 and
nftables.

Each node is a namespace with its own address (SUBNET.2, .3, ...) on a
veth pair whose other end is a port of the bridge; the bridge holds
SUBNET.1, so processes of the root namespace (the test, tandemctl,
daemons not placed on a node) reach every node. Faults act on a node's
bridge port, so they hit everything that node sends or receives:
`slow` (tc tbf at 2 Mbit/s: a weight broadcast crawls and queues delay;
these machines' kernel has no sch_netem), `loss` (nftables, bridge
family, drops 20% of the node's packets both ways) and `partition` (the
port down: the node is cut off)."""

import subprocess

FAULTS = ("slow", "loss", "partition")


def sh(*args):
    subprocess.run(args, check=True, capture_output=True, text=True)


def quiet(*args):
    subprocess.run(args, capture_output=True)


def available():
    """None when namespaces can be made here, else why not."""
    import os
    import shutil
    if os.geteuid() != 0:
        return "needs root (ip netns, a bridge, nftables)"
    for tool in ("ip", "tc", "nft"):
        if shutil.which(tool) is None:
            return f"needs {tool} (iproute2, nftables)"
    return None


class Lan:
    """`nodes` (names) as namespaces named TAG-NAME on the bridge TAGbr.
    TAG is at most 6 characters (Linux interface names end at 15)."""

    def __init__(self, tag, nodes, subnet):
        self.tag = tag
        self.bridge = f"{tag}br"
        self.subnet = subnet
        self.nodes = list(nodes)
        self.teardown()
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.host_address}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for i, node in enumerate(self.nodes):
            ns, port, inner = self.namespace(node), self.port(node), f"{tag}n{i}"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", port, "type", "veth", "peer", "name", inner)
            sh("ip", "link", "set", inner, "netns", ns)
            sh("ip", "link", "set", port, "master", self.bridge)
            sh("ip", "link", "set", port, "up")
            sh("ip", "netns", "exec", ns, "ip", "addr", "add",
               f"{self.address(node)}/24", "dev", inner)
            sh("ip", "netns", "exec", ns, "ip", "link", "set", inner, "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")

    @property
    def host_address(self):
        return f"{self.subnet}.1"

    def namespace(self, node):
        return f"{self.tag}-{node}"

    def port(self, node):
        return f"{self.tag}h{self.nodes.index(node)}"

    def address(self, node):
        return f"{self.subnet}.{self.nodes.index(node) + 2}"

    def prefix(self, node):
        """The command prefix that runs a process on `node`."""
        return ["ip", "netns", "exec", self.namespace(node)]

    def fault(self, node, kind):
        port = self.port(node)
        if kind == "partition":
            sh("ip", "link", "set", port, "down")
        elif kind == "slow":
            sh("tc", "qdisc", "replace", "dev", port, "root",
               "tbf", "rate", "2mbit", "burst", "32kbit", "latency", "400ms")
        elif kind == "loss":
            table = self.table(node)
            sh("nft", "add", "table", "bridge", table)
            for chain, hook in (("c_in", "input"), ("c_fwd", "forward"),
                                ("c_out", "output")):
                sh("nft", "add", "chain", "bridge", table, chain,
                   f"{{ type filter hook {hook} priority 0; }}")
                for way in ("iifname", "oifname"):
                    sh("nft", "add", "rule", "bridge", table, chain, way,
                       port, "numgen", "random", "mod", "100", "<", "20",
                       "drop")
        else:
            raise ValueError(f"unknown network fault {kind!r} ({FAULTS})")

    def heal(self, node):
        port = self.port(node)
        quiet("tc", "qdisc", "del", "dev", port, "root")
        quiet("nft", "delete", "table", "bridge", self.table(node))
        sh("ip", "link", "set", port, "up")

    def table(self, node):
        return f"{self.tag}_{self.nodes.index(node)}"

    def teardown(self):
        for i, node in enumerate(self.nodes):
            quiet("nft", "delete", "table", "bridge", f"{self.tag}_{i}")
            quiet("ip", "link", "del", f"{self.tag}h{i}")
            quiet("ip", "netns", "del", self.namespace(node))
        quiet("ip", "link", "del", self.bridge)
