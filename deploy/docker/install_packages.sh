#!/bin/sh
# Installs the Debian packages listed in FILE (one a line) without their
# recommendations, then removes the list and apt's indexes.
#
#   install_packages FILE
set -eu
apt-get update -q
xargs -a "$1" apt-get install -y -q --no-install-recommends
rm -rf /var/lib/apt/lists/* "$1"
