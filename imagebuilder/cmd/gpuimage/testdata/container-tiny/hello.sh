#!/bin/sh
echo "$GREETING from $(id -u):$(id -g) in $(pwd)"
