import os, signal, subprocess, time
from pathlib import Path
from conftest import *  # noqa
from test_persistence import helper_pid, _restarted, until

def test_tree(server_factory, env):
    srv = server_factory()
    text, err = srv.tool("bg", command="sleep 1000", name="s")
    h = helper_pid(env)
    os.kill(h, signal.SIGKILL)
    until(lambda: _restarted(env, h), "restarted")
    time.sleep(3)
    print(subprocess.run("ps -eo pid,ppid,args:80 --forest | grep -A8 'sandbox-mcp daemon' | grep -v grep", shell=True, capture_output=True, text=True).stdout)
    print(srv.tool("status"))
    print(srv.tool("exec", command="ps aux"))
