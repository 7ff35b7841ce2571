"""One rendered pod run on this machine as the kubelet would: its own network, mounts, /tmp, user and env."""
import os
import shlex
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helm.pod_network import PodNetwork

_PROBE_GRACE_S = 1.0


@dataclass(slots=True, frozen=True)
class Image:
    """What the replay runs in place of the image: this virtualenv's commands, as the image's user."""

    bin_dir: Path
    runtime: Path  # the interpreter's installation the virtualenv links to
    uid: int = 1000
    gid: int = 100

    def reach_script(self, stash: Path) -> str:
        """Mount lines that let the image's user reach `runtime` where a parent folder is closed to others.

        In an image the interpreter is readable by its user; here it may sit under root's private home. Inside
        the pod's own mount namespace that parent is replaced by an empty tmpfs holding only `runtime`.
        """
        closed = [p for p in reversed(self.runtime.parents) if p != p.parent and not p.stat().st_mode & 0o001]
        if not closed:
            return ""
        parent, inner = closed[0], shlex.quote(str(self.runtime))
        return "\n".join([f"mkdir -p {shlex.quote(str(stash))}", f"mount --bind {inner} {shlex.quote(str(stash))}",
                          f"mount -t tmpfs -o mode=755 tmpfs {shlex.quote(str(parent))}", f"mkdir -p {inner}",
                          f"mount --bind {shlex.quote(str(stash))} {inner}"])


@dataclass(slots=True)
class PodVolumes:
    """Each volume of a pod spec made as the kubelet makes it, as a folder under `root` (or a tmpfs)."""

    root: Path
    secrets: dict[str, dict[str, bytes]]
    claims: dict[str, Path]
    fs_group: int | None
    folders: dict[str, Path | None] = field(default_factory=dict)  # None: a memory-backed emptyDir

    def make(self, volume: dict[str, Any]) -> None:
        name = volume["name"]
        folder = self.root / "volumes" / name
        if "emptyDir" in volume:
            if (volume["emptyDir"] or {}).get("medium") == "Memory":
                self.folders[name] = None
                return
            folder.mkdir(parents=True)
            folder.chmod(0o777)  # the kubelet makes an emptyDir world-writable
        elif "ephemeral" in volume or "persistentVolumeClaim" in volume:
            claim = volume.get("persistentVolumeClaim", {}).get("claimName")
            if claim is not None and claim in self.claims:
                folder = self.claims[claim]
            else:  # a fresh claim: a root-owned 0755 file system
                folder.mkdir(parents=True)
                folder.chmod(0o755)
        elif "hostPath" in volume:
            folder = self.root.parent / "node" / volume["hostPath"]["path"].strip("/")
            folder.mkdir(parents=True, exist_ok=True)  # DirectoryOrCreate: root-owned 0755, fsGroup not applied
            self.folders[name] = folder
            return
        elif "secret" in volume:
            self._write_secret(folder, volume["secret"])
        else:
            raise NotImplementedError(f"volume {name}: the replay makes emptyDir, PVC, hostPath and secret volumes")
        self._own(folder)
        self.folders[name] = folder

    def _write_secret(self, folder: Path, source: dict[str, Any]) -> None:
        data = self.secrets[source["secretName"]]
        folder.mkdir(parents=True)
        items = source.get("items") or [{"key": key, "path": key} for key in data]
        for item in items:
            target = folder / item["path"]
            target.write_bytes(data[item["key"]])
            target.chmod(0o644)

    def _own(self, folder: Path) -> None:
        """fsGroup (SetVolumeOwnership): the volume's files belong to the group, writable by it, setgid dirs."""
        if self.fs_group is None:
            return
        for path in [folder, *folder.rglob("*")]:
            os.chown(path, -1, self.fs_group)
            mode = path.stat().st_mode & 0o7777
            path.chmod(mode | 0o060 | (0o2010 if path.is_dir() else 0))


@dataclass(slots=True)
class Pod:
    """A pod of the rendered chart: its Ray container (as KubeRay completed it) and init containers."""

    name: str
    spec: dict[str, Any]
    container: dict[str, Any]
    labels: dict[str, str]
    namespace: str
    node_name: str
    image: Image
    network: PodNetwork
    volumes: PodVolumes
    netns: str = ""
    ip: str = ""
    hosts: dict[str, str] = field(default_factory=dict)  # what cluster DNS would resolve: name -> IP
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _stubs: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.netns, self.ip = self.network.add_pod()
        for volume in self.spec.get("volumes", []):
            self.volumes.make(volume)
        (self.volumes.root / "tmp").mkdir(parents=True)
        (self.volumes.root / "tmp").chmod(0o1777)

    @property
    def log_dir(self) -> Path:
        return self.volumes.root

    def user(self, container: dict[str, Any]) -> tuple[int, int]:
        """runAsUser / runAsGroup of the container, else of the pod, else the image's."""
        pod, own = self.spec.get("securityContext", {}), container.get("securityContext", {})
        uid = own.get("runAsUser", pod.get("runAsUser", self.image.uid))
        gid = own.get("runAsGroup", pod.get("runAsGroup", self.image.gid))
        return uid, gid

    def env(self, container: dict[str, Any]) -> dict[str, str]:
        """The container's environment with fieldRef and secretKeyRef resolved, over the image's own."""
        values = {"PATH": f"{self.image.bin_dir}:/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp/home",
                  "LANG": "C.UTF-8", "RAY_USAGE_STATS_ENABLED": "0"}  # no network here: never report usage
        for entry in container.get("env", []):
            if "value" in entry:
                values[entry["name"]] = str(entry["value"])
                continue
            source = entry["valueFrom"]
            if "fieldRef" in source:
                values[entry["name"]] = self._field(source["fieldRef"]["fieldPath"])
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                values[entry["name"]] = self.volumes.secrets[ref["name"]][ref["key"]].decode()
            else:
                raise NotImplementedError(f"env {entry['name']}: {source}")
        return values

    def _field(self, path: str) -> str:
        if path.startswith("metadata.labels['"):
            return self.labels[path.removeprefix("metadata.labels['").removesuffix("']")]
        known = {"metadata.name": self.name, "metadata.namespace": self.namespace, "spec.nodeName": self.node_name,
                 "status.podIP": self.ip}
        return known[path]

    def _mount_script(self, container: dict[str, Any]) -> str:
        """Shell lines that mount the container's volumes, a tmpfs per memory emptyDir and a private /tmp."""
        private_tmp = self.volumes.root / "tmp"
        lines = [self.image.reach_script(self.volumes.root / "runtime")]
        for mount in container.get("volumeMounts", []):
            target = Path(mount["mountPath"])
            if target.is_relative_to("/tmp"):  # KubeRay's /tmp/ray on the head: into the pod's own /tmp
                target = private_tmp / target.relative_to("/tmp")
                lines.append(f"mkdir -p {shlex.quote(str(target))}")
            elif not target.exists():  # a mount point on this machine's tree: made here, removed at the end
                top = target
                while not top.parent.exists():
                    top = top.parent
                self._stubs.append(top)
                target.mkdir(parents=True)
            source = self.volumes.folders[mount["name"]]
            if source is None:
                lines.append(f"mount -t tmpfs -o mode=1777 tmpfs {shlex.quote(str(target))}")
                continue
            lines.append(f"mount --bind {shlex.quote(str(source))} {shlex.quote(str(target))}")
            if mount.get("readOnly"):
                lines.append(f"mount -o remount,bind,ro {shlex.quote(str(target))}")
        if self.hosts:
            hosts_file = self.volumes.root / "hosts"
            names = "".join(f"{ip} {name}\n" for name, ip in self.hosts.items())
            hosts_file.write_text(f"127.0.0.1 localhost\n{names}")
            lines.append(f"mount --bind {shlex.quote(str(hosts_file))} /etc/hosts")
        # Last, as the sources live under this machine's /tmp; --rbind keeps what was mounted inside it.
        lines.append(f"mount --rbind {shlex.quote(str(private_tmp))} /tmp")
        return "\n".join(lines)

    def _command(self, container: dict[str, Any], argv: list[str], mounts: bool = True) -> list[str]:
        uid, gid = self.user(container)
        groups = sorted({gid} | ({self.volumes.fs_group} if self.volumes.fs_group is not None else set()))
        env = [f"{k}={v}" for k, v in self.env(container).items()]
        run = ["setpriv", f"--reuid={uid}", f"--regid={gid}", f"--groups={','.join(map(str, groups))}",
               "env", "-i", *env, *argv]
        script = (self._mount_script(container) + "\n" if mounts else "") + \
            self._home_script(uid, gid) + "\nexec " + shlex.join(run)
        return ["ip", "netns", "exec", self.netns, "unshare", "--mount", "--propagation", "private", "--",
                "/bin/bash", "-ec", script]

    def _home_script(self, uid: int, gid: int) -> str:
        """The image user's home, private to the pod."""
        return f"mkdir -p /tmp/home && chown {uid}:{gid} /tmp/home"

    def start(self, container: dict[str, Any], argv: list[str], log_name: str) -> subprocess.Popen[bytes]:
        """Run `argv` as this container would, its output in `<root>/<log_name>.log`."""
        log = (self.log_dir / f"{log_name}.log").open("ab")
        process = subprocess.Popen(self._command(container, argv), stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        self.processes.append(process)
        return process

    def run_init_containers(self, extra: list[tuple[dict[str, Any], list[str]]], timeout_s: float) -> None:
        """The template's init containers, then the ones KubeRay adds, each to completion, in order."""
        steps = [(c, c.get("command", []) + c.get("args", [])) for c in self.spec.get("initContainers", [])]
        for container, argv in steps + extra:
            log_name = f"init-{container['name']}"
            try:
                code = self.start(container, argv, log_name).wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{self.name}: init container {container['name']} still running after "
                                     f"{timeout_s:.0f} s:\n{self.log_tail(log_name)}") from None
            if code != 0:
                raise AssertionError(f"{self.name}: init container {container['name']} exited {code}:\n"
                                     f"{self.log_tail(log_name)}")

    def log_tail(self, log_name: str, num_lines: int = 30) -> str:
        path = self.log_dir / f"{log_name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-num_lines:]) if path.exists() else ""

    def port(self, port: int | str) -> int:
        """A probe's port: a number, or the name of one of the Ray container's ports."""
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for declared in self.container.get("ports", []):
            if declared.get("name") == port:
                return int(declared["containerPort"])
        raise AssertionError(f"{self.name}: no container port named {port!r}")

    def probe(self, probe: dict[str, Any]) -> tuple[bool, str]:
        """One run of a probe, as the kubelet runs it: (passed, what it saw)."""
        timeout_s = probe.get("timeoutSeconds", 1) + _PROBE_GRACE_S
        if "httpGet" in probe:
            action = probe["httpGet"]
            url = f"http://{self.ip}:{self.port(action['port'])}/{action.get('path', '/').lstrip('/')}"
            try:
                with urllib.request.urlopen(url, timeout=timeout_s) as answer:
                    return 200 <= answer.status < 400, f"GET {url}: {answer.status}"
            except urllib.error.HTTPError as error:
                return False, f"GET {url}: {error.code}"
            except OSError as error:
                return False, f"GET {url}: {error}"
        if "exec" in probe:
            command = self._command(self.container, probe["exec"]["command"], mounts=False)
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                return False, f"exec {probe['exec']['command']}: timed out"
            return done.returncode == 0, f"exec {probe['exec']['command'][-1]!r}: exit {done.returncode}"
        raise NotImplementedError(f"probe {probe}")

    def wait_probe(self, kind: str, timeout_s: float, period_s: float = 1.0) -> str:
        """Run the container's `kind` probe until it passes; the kubelet's view of the failure otherwise."""
        probe = self.container.get(kind)
        if probe is None:
            return f"{kind}: none"
        deadline, seen = time.monotonic() + timeout_s, ""
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.poll() not in (None, 0):
                    raise AssertionError(f"{self.name}: a container exited {process.returncode}")
            passed, seen = self.probe(probe)
            if passed:
                return seen
            time.sleep(period_s)
        raise AssertionError(f"{self.name}: {kind} never passed in {timeout_s:.0f} s; last: {seen}")

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, 9)
                process.wait(timeout=30)
        for stub in reversed(self._stubs):
            for folder in sorted([stub, *stub.rglob("*")], key=lambda p: len(p.parts), reverse=True):
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()

