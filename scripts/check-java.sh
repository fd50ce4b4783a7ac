#!/usr/bin/env bash
# Fails with a clear message unless Java >= 17 is on this machine (PySpark 4 needs it).
set -euo pipefail
java_bin="${JAVA_HOME:+$JAVA_HOME/bin/}java"
if ! command -v "$java_bin" >/dev/null 2>&1; then
  echo "error: Java 17 or newer is required by PySpark 4 and no 'java' was found." >&2
  echo "       Install it (Debian/Ubuntu: apt-get install openjdk-17-jre-headless) or set JAVA_HOME." >&2
  exit 1
fi
version=$("$java_bin" -version 2>&1 | awk -F'"' '/version/ {print $2; exit}')
major=${version%%.*}
[ "$major" = "1" ] && major=$(echo "$version" | cut -d. -f2)
if ! [[ "$major" =~ ^[0-9]+$ ]] || [ "$major" -lt 17 ]; then
  echo "error: Java 17 or newer is required by PySpark 4; found '$version' at $(command -v "$java_bin")." >&2
  echo "       Install a newer JDK (apt-get install openjdk-17-jre-headless) or point JAVA_HOME at one." >&2
  exit 1
fi
