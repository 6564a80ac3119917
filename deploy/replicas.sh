#!/usr/bin/env bash
# N bertdemo processes on this machine, ports 7861..7860+N, and the nginx site that spreads
# visitors over them (each visitor kept on one).
#   deploy/replicas.sh 3 --model /models/bert-base-uncased     # extra flags go to every replica
#   python deploy/nginx.py 127.0.0.1:7861 127.0.0.1:7862 127.0.0.1:7863 \
#       | sudo tee /etc/nginx/conf.d/bertdemo.conf && sudo nginx -s reload   # printed below too
# Ctrl-C or SIGTERM stops them all cleanly (each ends its runs and removes its files).
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:?usage: deploy/replicas.sh N [app.py flags...]}"
shift
pids=()
trap 'kill -TERM "${pids[@]}" 2>/dev/null; wait' INT TERM
addresses=()
for i in $(seq 1 "$n"); do
  port=$((7860 + i))
  BERTDEMO_REPLICA=1 python app.py --host 127.0.0.1 --port "$port" "$@" &
  pids+=("$!")
  addresses+=("127.0.0.1:$port")
done
echo "replicas: ${addresses[*]}; the nginx site: python deploy/nginx.py ${addresses[*]}"
wait
