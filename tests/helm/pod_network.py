"""A network of pods on this machine: one network namespace per pod on a bridge, no route out of it."""
import ipaddress
import secrets
import subprocess
from dataclasses import dataclass, field


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.240.0.0/12 that no address or route of this machine uses."""
    routes = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True).stdout
    addresses = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    for _ in range(64):
        subnet = ipaddress.ip_network(f"10.{240 + secrets.randbelow(16)}.{secrets.randbelow(256)}.0/24")
        prefix = str(subnet.network_address).rsplit(".", 1)[0] + "."
        if prefix not in routes and prefix not in addresses:
            return subnet
    raise RuntimeError("no free /24 in 10.240.0.0/12 for the pod network")


@dataclass(slots=True)
class PodNetwork:
    """A bridge in this namespace (the node, where the test and the probes run) and a namespace per pod.

    Pods reach each other and the node over the bridge; a policy rule drops whatever they send beyond the
    subnet, so nothing leaves this machine. Each pod has its own loopback and ports, as in Kubernetes.
    """

    name: str = field(default_factory=lambda: f"bs{secrets.token_hex(3)}")
    subnet: ipaddress.IPv4Network = field(default_factory=_free_subnet)
    pods: dict[str, str] = field(default_factory=dict)  # namespace -> pod IP
    _table: int = field(default_factory=lambda: 20000 + secrets.randbelow(10000))

    @property
    def gateway(self) -> str:
        return str(self.subnet.network_address + 1)

    def __enter__(self) -> "PodNetwork":
        bridge, cidr = self.name, f"/{self.subnet.prefixlen}"
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", self.gateway + cidr, "dev", bridge)
        _ip("link", "set", bridge, "up")
        # Forwarded traffic from the pods finds only their own subnet; anything else is dropped here.
        _ip("route", "add", str(self.subnet), "dev", bridge, "table", str(self._table))
        _ip("route", "add", "blackhole", "default", "table", str(self._table))
        _ip("rule", "add", "iif", bridge, "lookup", str(self._table), "priority", "100")
        return self

    def add_pod(self) -> tuple[str, str]:
        """A new pod namespace wired to the bridge: (namespace, IP)."""
        index = len(self.pods) + 2
        namespace, address = f"{self.name}-{index}", str(self.subnet.network_address + index)
        host_end, cidr = f"{self.name}v{index}", f"/{self.subnet.prefixlen}"
        _ip("netns", "add", namespace)
        _ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        _ip("link", "set", host_end, "master", self.name, "up")
        _ip("-n", namespace, "addr", "add", address + cidr, "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        # A default route, as a pod has: Ray finds its node IP from the route it would use to leave.
        _ip("-n", namespace, "route", "add", "default", "via", self.gateway)
        self.pods[namespace] = address
        return namespace, address

    def __exit__(self, *exc: object) -> None:
        for namespace in self.pods:
            subprocess.run(["ip", "netns", "pids", namespace], capture_output=True)
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        subprocess.run(["ip", "rule", "del", "iif", self.name, "lookup", str(self._table)], capture_output=True)
        subprocess.run(["ip", "route", "flush", "table", str(self._table)], capture_output=True)
        subprocess.run(["ip", "link", "del", self.name], capture_output=True)
