# The boot tier job's setup: the agent runs it in the unpacked code, once per job disk and code.
# It tells the host (the second serial port) where it ran, and counts its runs on the job disk.
echo "setup $(pwd)" > /dev/ttyS1
echo ran >> setup-runs
sync
