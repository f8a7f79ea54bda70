#!/bin/sh
# Spark 4 needs Java 17 or newer: find it as Spark does ($JAVA_HOME, else PATH) and say
# how to get it when it is missing or too old. Exit 0 when fine, 2 with one hint otherwise.
if [ -n "${JAVA_HOME:-}" ]; then
    java="$JAVA_HOME/bin/java"
else
    java=$(command -v java 2>/dev/null || true)
fi
hint="install Java 17 (Debian/Ubuntu: apt-get install openjdk-17-jre-headless) or point JAVA_HOME at one"
if [ -z "$java" ] || [ ! -x "$java" ]; then
    echo "make: Spark needs Java 17 or newer and none was found (JAVA_HOME unset, no java on PATH): $hint" >&2
    exit 2
fi
version=$("$java" -version 2>&1 | sed -n 's/.*version "\([0-9][0-9]*\)[."].*/\1/p' | head -n 1)
if [ -z "$version" ]; then
    version=$("$java" -version 2>&1 | sed -n 's/.*version "\([0-9][0-9]*\)".*/\1/p' | head -n 1)
fi
if [ -z "$version" ] || [ "$version" -lt 17 ]; then
    echo "make: Spark needs Java 17 or newer, $java is Java ${version:-of an unknown version}: $hint" >&2
    exit 2
fi
