"""nginx in front of N bertdemo processes (replicas), each visitor kept on one of them.

    python deploy/nginx.py 127.0.0.1:7861 127.0.0.1:7862 > /etc/nginx/conf.d/bertdemo.conf
    python deploy/nginx.py --listen 127.0.0.1:8080 --standalone /tmp/lb 127.0.0.1:7861 ...  # a whole
        nginx.conf for `nginx -p /tmp/lb -c /tmp/lb/nginx.conf` (not a daemon; what the tests run)

Why a visitor must stay on one replica: Gradio's protocol opens several connections per event
(join the queue, then read its events), and everything a visitor made (tuned models, classifiers,
downloads) lives in the process that made it. How: a new visitor (no `bertdemo_replica` cookie)
goes to the next replica that is up, round robin, and the answer sets the cookie to that replica's
name; later requests with the cookie go to that replica only. Browsers send the cookie by
themselves, and gradio_client keeps the cookies of its first request (/config) for every later
one, so one `Client` is one visitor. (`ip_hash` would put everyone behind one address — a
company's proxy, or loopback — on one replica.)

Faults: a new visitor is never sent to a replica that refuses connections or answers 502/503 (a
replica with no model answers its page with 503: `--replica`), and such a replica gets no new
visitor for `fail_timeout`. A visitor whose replica has gone gets `GONE`, at once: in
gradio_client as a ValidationError, in a browser as the text; the cookie is cleared, so reloading
the page (a new Client) continues on another replica, without what the old one held.
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import re
import sys
from pathlib import Path

COOKIE = "bertdemo_replica"
GONE = ("The bertdemo process that served you has stopped, and what it held for you (tuned "
        "models, classifiers, downloads) went with it. Reload the page (from a script: make a new "
        "gradio_client.Client) to continue on another one.")


def site(replicas: list[str], listen: str = "0.0.0.0:8080", fail_timeout_s: int = 10) -> str:
    """The http-context configuration (upstreams, maps, server) for `replicas` ("host:port")."""
    names = [f"r{i}" for i in range(len(replicas))]
    pool = "".join(f"    server {addr} max_fails=1 fail_timeout={fail_timeout_s}s;\n" for addr in replicas)
    each = "".join(f"upstream bertdemo_{name} {{ server {addr}; keepalive 8; }}\n"
                   for name, addr in zip(names, replicas))
    by_cookie = "".join(f"    {name} bertdemo_{name};\n" for name in names)
    by_addr = "".join(f'    "~{pattern}" {name};\n' for name, pattern in zip(names, answered_patterns(replicas)))
    return f"""# bertdemo behind nginx: {len(replicas)} replicas, each visitor kept on one (deploy/nginx.py)
upstream bertdemo_any {{  # a new visitor: the next replica that is up
{pool}    keepalive 16;
}}
{each}
map $cookie_{COOKIE} $bertdemo_upstream {{  # a returning visitor: their replica, and only it
    default bertdemo_any;
{by_cookie}}}
map $upstream_addr $bertdemo_served_by {{  # the replica that answered (the last address tried)
    default "";
{by_addr}}}
map $bertdemo_upstream $bertdemo_new_cookie {{  # set once, on a new visitor's first answer
    default "";
    bertdemo_any "{COOKIE}=$bertdemo_served_by; Path=/; HttpOnly; SameSite=Lax";
}}

server {{
    listen {listen};
    client_max_body_size 2m;  # the app takes uploads of 1 MB at most

    location / {{
        proxy_pass http://$bertdemo_upstream;
        proxy_http_version 1.1;  # keep-alive to the replicas, and chunked server-sent events
        proxy_set_header Connection "";
        proxy_set_header Host $http_host;  # Gradio builds its file URLs from these
        proxy_set_header X-Forwarded-Host $http_host;
        proxy_set_header X-Forwarded-Proto $scheme;
        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        proxy_buffering off;  # server-sent events: each one to the visitor as it is written
        proxy_cache off;
        proxy_read_timeout 1h;  # an event stream is quiet between events; a run lasts minutes
        proxy_send_timeout 1h;
        proxy_connect_timeout 3s;
        proxy_next_upstream error timeout http_502 http_503;  # new visitors only: their pool has others
        add_header Set-Cookie $bertdemo_new_cookie;
        add_header X-Bertdemo-Replica $bertdemo_served_by;
        error_page 502 504 = @replica_gone;  # nginx's own: the replica refused or did not answer
    }}

    location @replica_gone {{
        add_header Set-Cookie "{COOKIE}=; Path=/; Max-Age=0" always;
        add_header Cache-Control "no-store" always;
        # gradio_client raises a 422's validation message as it is (a 503 would read "queue is full")
        if ($uri ~ "/queue/join$") {{
            return 422 '{_gone_json()}';
        }}
        default_type text/plain;
        return 502 "{GONE}\\n";
    }}
}}
"""


def answered_patterns(replicas: list[str]) -> list[str]:
    """For each replica, a regex matching nginx's `$upstream_addr` when it answered. nginx shows
    an address, never a host name (resolved at start): a replica named by its host is known by
    its port, which must then be its own (docker compose: one port per service)."""
    hosts_ok = all(_is_ip(addr.rsplit(":", 1)[0]) for addr in replicas)
    ports = [addr.rsplit(":", 1)[1] for addr in replicas]
    if not hosts_ok and len(set(ports)) < len(ports):
        raise ValueError("Replicas named by host need ports of their own (nginx knows them by address): "
                         + ", ".join(replicas))
    return [f"(^|, ){re.escape(addr)}$" if hosts_ok else f":{port}$" for addr, port in zip(replicas, ports)]


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return False


def _gone_json() -> str:
    detail = [{"__type__": "validate", "is_valid": False, "parameter_name": "server", "message": GONE}]
    return json.dumps({"detail": detail})


def standalone(site_conf: str, prefix: Path) -> str:
    """A whole nginx.conf around `site_conf` that runs in the foreground with every file (pid,
    logs, temp) under `prefix`: `nginx -p PREFIX -c PREFIX/nginx.conf`, no root needed."""
    temps = "".join(f"    {kind}_temp_path {prefix / (kind + '_temp')};\n"
                    for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    indented = "".join(f"    {line}\n" if line else "\n" for line in site_conf.splitlines())
    return f"""daemon off;
worker_processes 1;
pid {prefix / 'nginx.pid'};
error_log {prefix / 'error.log'} warn;
events {{ worker_connections 1024; }}
http {{
    access_log {prefix / 'access.log'};
{temps}{indented}}}
"""


def write_standalone(replicas: list[str], listen: str, prefix: Path, fail_timeout_s: int = 10) -> Path:
    """`prefix`/nginx.conf for `replicas`; returns its path."""
    prefix.mkdir(parents=True, exist_ok=True)
    conf = prefix / "nginx.conf"
    conf.write_text(standalone(site(replicas, listen, fail_timeout_s), prefix.resolve()))
    return conf


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("replicas", nargs="+", metavar="HOST:PORT", help="each bertdemo process")
    parser.add_argument("--listen", default="0.0.0.0:8080", help="where nginx serves visitors")
    parser.add_argument("--fail-timeout", type=int, default=10,
                        help="seconds a replica that failed gets no new visitor")
    parser.add_argument("--standalone", type=Path, metavar="PREFIX",
                        help="write a whole nginx.conf into PREFIX instead of printing the site")
    args = parser.parse_args(argv)
    if args.standalone:
        print(write_standalone(args.replicas, args.listen, args.standalone, args.fail_timeout))
    else:
        sys.stdout.write(site(args.replicas, args.listen, args.fail_timeout))


if __name__ == "__main__":
    main()
