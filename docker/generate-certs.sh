#!/usr/bin/env bash
# Make the TLS certificates and SuperNode key pairs of a fairclip deployment.
#
#   docker/generate-certs.sh [-n NUM_SUPERNODES] [-o OUT_DIR] [HOST ...]
#
# OUT_DIR (default docker/certs) receives
#   ca.crt, ca.key            a CA (keep ca.key private; ca.crt goes to every SuperNode and flwr CLI)
#   server.pem, server.key    the SuperLink's certificate, valid for every HOST (IP or DNS name;
#                             default: superlink localhost 127.0.0.1) and signed by the CA
#   supernode-I, supernode-I.pub   (I = 1..N) one key pair per SuperNode: a P-384 EC key in OpenSSH
#                             format (flower-supernode --auth-supernode-private-key) and its
#                             public key line, registered with `flwr supernode register`.
# Existing files are kept, so the script can be re-run to add SuperNodes (-n larger).
# Needs openssl (TLS) and ssh-keygen (SuperNode keys: Flower reads them in OpenSSH format only).
set -euo pipefail

num_supernodes=3
out_dir="$(cd "$(dirname "$0")" && pwd)/certs"
days=365
while getopts "n:o:d:h" opt; do
  case "$opt" in
    n) num_supernodes="$OPTARG" ;;
    o) out_dir="$OPTARG" ;;
    d) days="$OPTARG" ;;
    h) sed -n '2,16p' "$0"; exit 0 ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
hosts=("$@")
if [ "${#hosts[@]}" -eq 0 ]; then
  hosts=(superlink localhost 127.0.0.1)
fi

for tool in openssl ssh-keygen; do
  command -v "$tool" >/dev/null || { echo "generate-certs.sh: $tool not found" >&2; exit 1; }
done
mkdir -p "$out_dir"
cd "$out_dir"
umask 077

# subjectAltName: IP addresses as IP entries, everything else as DNS names
san=""
for host in "${hosts[@]}"; do
  if [[ "$host" =~ ^[0-9.]+$ || "$host" == *:* ]]; then entry="IP:$host"; else entry="DNS:$host"; fi
  san="${san:+$san,}$entry"
done

if [ ! -f ca.crt ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout ca.key -out ca.crt -days "$days" -subj "/CN=fairclip CA" \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
    -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -addext "subjectKeyIdentifier=hash" 2>/dev/null
  echo "wrote $out_dir/ca.crt, ca.key"
fi

if [ ! -f server.pem ]; then
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout server.key -out server.csr -subj "/CN=${hosts[0]}" 2>/dev/null
  cat > server.ext <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=$san
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
EOF
  openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
    -out server.pem -days "$days" -sha256 -extfile server.ext 2>/dev/null
  rm -f server.csr server.ext ca.srl
  echo "wrote $out_dir/server.pem, server.key for $san"
fi

for i in $(seq 1 "$num_supernodes"); do
  if [ ! -f "supernode-$i" ]; then
    ssh-keygen -q -t ecdsa -b 384 -N "" -C "fairclip-supernode-$i" -f "supernode-$i"
    echo "wrote $out_dir/supernode-$i, supernode-$i.pub"
  fi
done

chmod 644 ca.crt server.pem ./*.pub
chmod 600 ca.key server.key
for i in $(seq 1 "$num_supernodes"); do chmod 600 "supernode-$i"; done

cat <<EOF
Private keys are readable by their owner only. Flower's containers run as user 'app' (uid 49999):
for docker compose on this machine run  sudo chown -R 49999:49999 "$out_dir"
On a real deployment copy ca.crt to every machine, server.pem and server.key to the SuperLink's,
supernode-I (private key) only to SuperNode I's machine, and ca.key to none.
EOF
