#!/bin/sh
# Start Jupyter (Debian's jupyter-notebook) for gpurack's notebook image: on 0.0.0.0:8888,
# no browser, notebooks in NOTEBOOK_DIR (default: the work directory, /work). Jupyter reads
# its token from JUPYTER_TOKEN; without one it would print a random token to the log, so
# the image refuses to start instead.
set -eu
if [ -z "${JUPYTER_TOKEN:-}" ]; then
	echo "start-notebook: set JUPYTER_TOKEN (from a Secret) to the token clients must present" >&2
	exit 2
fi
python3 /usr/local/lib/gpurack/device.py
exec jupyter-notebook --no-browser --ip=0.0.0.0 --port=8888 --notebook-dir="${NOTEBOOK_DIR:-/work}" "$@"
