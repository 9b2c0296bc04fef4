# session 89: export/builder_zygote.py (Z), written by a helper session
# export/builder_zygote.py (Z): onnxruntime-genai's model builder started as a process of its own (Alone) or forked
# from a "zygote" that preloaded its imports: the zygote's side (_preload and its CUDA refusal, the 8-byte big-endian
# length + one fd framing of _receive/_exact, _child's fd redirections, environment, cwd, argv, runpy, exit codes and
# SIGINT ending, _say's JSON lines, main's ready/loop/fork/waitpid), and the exporting process's side (_import_env,
# Alone, Zygote's start/reply/usable/close, Forked's request/read/kill/wait/_end, _forks/_zygote's choice and
# replacement, prestart_builder/start_builder's lock, _stop).
# Run from the clone root (with the edgespec_export -> export link, README.md):
#   python docs/bench/mutation_harness/run.py docs/bench/mutation_harness/builder_zygote.py tests/test_builder_zygote.py
# Likely tests: tests/test_builder_zygote.py (all of it; test_builds_fork_... uses the real builder's ~7 s preload);
# tests/test_build.py monkeypatches start_builder, so it catches none of these. Mutants marked "(may hang: timeout)"
# leave a read or a lock waiting forever: pytest-timeout (120 s) is what fails them.
Z = "export/builder_zygote.py"
MUTANTS = [
# ---- _die_with_parent ----
# Z1 _die_with_parent: no PR_SET_PDEATHSIG on Linux (a killed zygote's build runs on) (no test found)
("Z1", Z, '    if sys.platform.startswith("linux"):', '    if sys.platform.startswith("darwin"):'),
# ---- _preload ----
# Z2 _preload: any torch import (not only an initialised CUDA) refuses to serve (test_builds_fork_from_one_zygote_with_this_processs_environment_now)
("Z2", Z, '    if torch is not None and torch.cuda.is_initialized():', '    if torch is not None:'),
# ---- _exact / _receive: the framing ----
# Z3 _exact: one recv only, a short read not completed (no test found: small messages arrive whole)
("Z3", Z, '    while len(buf) < n:\n        chunk = sock.recv(n - len(buf))', '    if len(buf) < n:\n        chunk = sock.recv(n - len(buf))'),
# Z4 _exact: the bytes already read (the header from recv_fds) dropped (test_builds_fork_..., test_a_build_that_fails_says_why_...)
("Z4", Z, '    buf = first\n', '    buf = b""\n'),
# Z5 _receive: no room for the fd (ancillary data truncated): every request refused, the zygote ends (test_builds_fork_..., test_a_build_that_fails_...)
("Z5", Z, '    head, fds, _, _ = socket.recv_fds(sock, 8, 1)', '    head, fds, _, _ = socket.recv_fds(sock, 8, 0)'),
# ---- _child ----
# Z6 _child: the zygote's socket kept open in the build (no test found)
("Z6", Z, '        sock.close()\n        _die_with_parent(parent)', '        _die_with_parent(parent)'),
# Z7 _child: SIGINT left ignored (the zygote's) in the build: Ctrl-C does not stop it (no test found: the probe raises KeyboardInterrupt itself)
("Z7", Z, '        signal.signal(signal.SIGINT, signal.default_int_handler)\n', ''),
# Z8 _child: stdout not redirected to the pipe (the probe's JSON lost) (test_builds_fork_..., test_a_build_that_fails_..., test_a_killed_build_...)
("Z8", Z, '        os.dup2(out_fd, 1)\n', ''),
# Z9 _child: stderr not redirected (SystemExit's message and tracebacks lost) (test_a_build_that_fails_says_why_...)
("Z9", Z, '        os.dup2(out_fd, 2)\n', ''),
# Z10 _child: the build runs in the zygote's directory, not the exporting process's of now (test_builds_fork_...)
("Z10", Z, '        os.chdir(req["cwd"])\n', ''),
# Z11 _child: the zygote's environment not cleared (variables unset since its start survive) (no test found)
("Z11", Z, '        os.environ.clear()\n', ''),
# Z12 _child: the request's environment not applied (test_builds_fork_...: PROBE_VAR)
("Z12", Z, '        os.environ.update(req["env"])\n', ''),
# Z13 _child: sys.path[0] left the zygote's start directory (no test found)
("Z13", Z, '        sys.path[0] = req["cwd"]  #', '        sys.path[:0] = []  #'),
# Z14 _child: argv without its first entry (arguments shifted by one) (test_builds_fork_..., test_a_build_that_fails_...)
("Z14", Z, '        sys.argv = [req["module"], *req["argv"]]', '        sys.argv = [*req["argv"]]'),
# Z15 _child: runpy's re-import warning no longer silenced (test_builds_fork_...: "Warning" not in out)
("Z15", Z, '                                category=RuntimeWarning)', '                                category=DeprecationWarning)'),
# Z16 _child: the module run under its own name, not __main__ (builder_shim's main never runs) (test_builds_fork_...: rc == 2)
("Z16", Z, '        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)', '        runpy.run_module(req["module"], run_name=req["module"], alter_sys=True)'),
# Z17 _child: runpy without alter_sys (sys.argv[0], sys.modules["__main__"] not the module's) (no test found)
("Z17", Z, '        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)', '        runpy.run_module(req["module"], run_name="__main__", alter_sys=False)'),
# Z18 _child: a build that returns normally exits 1 (test_builds_fork_..., every test)
("Z18", Z, '        code = 0\n    except SystemExit', '        pass\n    except SystemExit'),
# Z19 _child: sys.exit() / SystemExit(None) taken as a message (prints "None", exit 1) (no test found)
("Z19", Z, '        if e.code is None or isinstance(e.code, int):', '        if isinstance(e.code, int):'),
# Z20 _child: SystemExit(0) exits 1 (test_an_interrupt_while_a_build_starts_or_ends_...: ends 0)
("Z20", Z, '            code = e.code or 0', '            code = e.code or 1'),
# Z21 _child: SystemExit's message not printed (test_a_build_that_fails_says_why_...)
("Z21", Z, '            print(e.code, file=sys.stderr)', '            pass'),
# Z22 _child: KeyboardInterrupt's traceback not printed (test_a_build_that_fails_says_why_...: "KeyboardInterrupt" in out)
("Z22", Z, '        traceback.print_exc()\n        interrupted = True', '        interrupted = True'),
# Z23 _child: KeyboardInterrupt ends 1, not by SIGINT (test_a_build_that_fails_says_why_...: rc == -SIGINT)
("Z23", Z, '        traceback.print_exc()\n        interrupted = True', '        traceback.print_exc()'),
# Z24 _child: an exception's traceback not printed (test_a_build_that_fails_says_why_...: "Traceback" in out)
("Z24", Z, '        traceback.print_exc()\n    finally:', '        pass\n    finally:'),
# Z25 _child: a failure's default exit code 0 (test_a_build_that_fails_says_why_...: rc == 1)
("Z25", Z, '    code = 1\n    interrupted = False', '    code = 0\n    interrupted = False'),
# Z26 _child: atexit handlers not run before os._exit (no test found)
("Z26", Z, '            atexit._run_exitfuncs()  #', '            pass  #'),
# Z27 _child: stdout not flushed before os._exit (a piped print's output lost) (test_builds_fork_..., test_a_build_that_fails_...)
("Z27", Z, '            sys.stdout.flush()\n', ''),
# Z28 _child: SIGINT sent to itself under default_int_handler (raises: exit 1, not -2) (test_a_build_that_fails_says_why_...)
("Z28", Z, '                signal.signal(signal.SIGINT, signal.SIG_DFL)\n', ''),
# ---- _say ----
# Z29 _say: Python's repr, not JSON (every reply unreadable: the zygote given up) (test_builds_fork_..., every Forked test)
("Z29", Z, '    sock.sendall(json.dumps(kw).encode() + b"\\n")', '    sock.sendall(str(kw).encode() + b"\\n")'),
# ---- main ----
# Z30 main: the zygote does not ignore SIGINT (a terminal's Ctrl-C ends it) (no test found)
("Z30", Z, '    signal.signal(signal.SIGINT, signal.SIG_IGN)\n    try:', '    try:'),
# Z31 main: a failed import still says ready (test_a_zygote_that_cannot_serve_is_asked_once)
("Z31", Z, '        why = f"{type(e).__name__}: {e}"', '        why = None'),
# Z32 main: the socket's end not taken as the end: the zygote spins on EOF (no test found: every close kills it)
("Z32", Z, '        if got is None:\n            return', '        if got is None:\n            continue'),
# Z33 main: the zygote keeps the pipe's write end: the reader never sees EOF (test_builds_fork_...) (may hang: timeout)
("Z33", Z, '            _child(req, out_fd, sock, me)\n        os.close(out_fd)\n', '            _child(req, out_fd, sock, me)\n'),
# Z34 main: the zygote's own pid said as the build's (kill() kills the zygote) (test_a_killed_build_ends_and_a_second_build_meanwhile_runs_alone)
("Z34", Z, '            _say(sock, pid=pid)', '            _say(sock, pid=os.getpid())'),
# Z35 main: the pid said only after the build ended (test_a_zygote_killed_during_a_build_fails_that_build; test_a_killed_build_... after 60 s)
("Z35", Z, '        try:\n            _say(sock, pid=pid)\n        finally:\n            _, status = os.waitpid(pid, 0)', '        _, status = os.waitpid(pid, 0)\n        _say(sock, pid=pid)'),
# Z36 main: the raw wait status said, not the returncode (exit 3 -> 768) (test_a_build_that_fails_says_why_...)
("Z36", Z, '        _say(sock, exit=os.waitstatus_to_exitcode(status))', '        _say(sock, exit=status)'),
# Z37 main: the exit status only (a signal's end said 0) (test_a_build_that_fails_...: kbd; test_a_killed_build_...: -9)
("Z37", Z, '        _say(sock, exit=os.waitstatus_to_exitcode(status))', '        _say(sock, exit=os.WEXITSTATUS(status))'),
# ---- _import_env / _IMPORT_TIME ----
# Z38 _import_env: exact names, not prefixes (nothing matches: env changes never seen) (test_a_changed_import_time_variable_gets_a_fresh_zygote)
("Z38", Z, '    return {k: v for k, v in env.items() if k.startswith(_IMPORT_TIME)}', '    return {k: v for k, v in env.items() if k in _IMPORT_TIME}'),
# Z39 _IMPORT_TIME: PYTHON* (PYTHONPATH) not watched (no test found: test_a_zygote_that_cannot_serve_... changes PYTHONPATH, but the zygote left before it differs in OMP_NUM_THREADS too)
("Z39", Z, '_IMPORT_TIME = ("PYTHON", "OMP_", "KMP_",', '_IMPORT_TIME = ("OMP_", "KMP_",'),
# ---- Alone ----
# Z40 Alone: the builder's arguments dropped (no test found: the Alone probe's argv is not checked)
("Z40", Z, '        self._p = subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE,', '        self._p = subprocess.Popen([sys.executable, "-m", module], stdout=subprocess.PIPE,'),
# Z41 Alone: stderr not joined to stdout (no test found)
("Z41", Z, 'stderr=subprocess.STDOUT, env=', 'env='),
# Z42 Alone: env replaces the environment rather than overlaying it (no test found: Alone builds get env {})
("Z42", Z, 'env=dict(os.environ, **env) if env else None)', 'env=env or None)'),
# Z43 Alone: returncode a method, never None (run_builder's finally never kills an interrupted Alone) (no test found)
("Z43", Z, '    @property\n    def returncode(self):', '    def returncode(self):'),
# Z44 Alone: kill() does nothing (no test found)
("Z44", Z, '    def kill(self) -> None:\n        self._p.kill()', '    def kill(self) -> None:\n        pass'),
# Z45 Alone: the pipe's read end not closed after wait (fd leak) (no test found)
("Z45", Z, '        rc = self._p.wait()\n        self._p.stdout.close()\n', '        rc = self._p.wait()\n'),
# ---- Zygote ----
# Z46 Zygote: its import-time environment not recorded (replaced before every build) (test_builds_fork_...: _ZYGOTE == [own_zygote])
("Z46", Z, '        self.env = _import_env(os.environ)', '        self.env = {}'),
# Z47 Zygote: its socket's fd not passed (the zygote fails at once) (test_builds_fork_..., every Forked test)
("Z47", Z, '                                         pass_fds=[theirs.fileno()], stdin', '                                         pass_fds=[], stdin'),
# Z48 Zygote: PRELOAD not passed (the zygote imports its own default: the real builder) (test_a_zygote_killed_before_it_said_ready_is_replaced_not_given_up)
("Z48", Z, '                                          *PRELOAD],', '                                          ],'),
# Z49 Zygote.reply: the zygote's end an EOFError (not OSError: not caught) (test_a_zygote_killed_before_it_said_ready_..., test_a_zygote_killed_during_a_build_...)
("Z49", Z, '            raise ConnectionError("the builder\'s zygote ended")', '            raise EOFError("the builder\'s zygote ended")'),
# Z50 Zygote.reply: a reply without the expected key accepted (None returned) (no test found)
("Z50", Z, '        if not isinstance(got, dict) or not isinstance(got.get(key), (int, bool)):', '        if not isinstance(got, dict):'),
# Z51 Zygote.usable: a zygote that cannot serve is asked again at every build (test_a_zygote_that_cannot_serve_is_asked_once)
("Z51", Z, '                    _UNAVAILABLE.append(True)\n', '                    pass\n'),
# Z52 Zygote.usable: a zygote killed before it said ready turns zygotes off (test_a_zygote_killed_before_it_said_ready_is_replaced_not_given_up)
("Z52", Z, '                self.ready = False\n            else:', '                self.ready = False\n                _UNAVAILABLE.append(True)\n            else:'),
# Z53 Zygote.usable: a zygote that is not ready kept in _ZYGOTE (test_a_zygote_that_cannot_serve_is_asked_once: not _ZYGOTE)
("Z53", Z, '            if not self.ready:\n                self.close(kill=True)\n', ''),
# Z54 Zygote.close: the socket's makefile not closed (the fd stays open) (no test found)
("Z54", Z, '        self._lines.close()\n        self.sock.close()', '        self.sock.close()'),
# Z55 Zygote.close: kill=True does not kill (the zygote, its build, end at EOF or after 5 s) (no test found: slower only)
("Z55", Z, '        if kill:\n            self.proc.kill()', '        if False:\n            self.proc.kill()'),
# ---- Forked ----
# Z56 Forked: the build's env under this process's, not over it (test_builds_fork_...: "given")
("Z56", Z, '"env": dict(os.environ, **env),', '"env": dict(env, **os.environ),'),
# Z57 Forked: a 4-byte length sent (the zygote reads payload bytes as length) (test_builds_fork_..., every Forked test)
("Z57", Z, '[len(payload).to_bytes(8, "big")]', '[len(payload).to_bytes(4, "big")]'),
# Z58 Forked: this process keeps the pipe's write end: reads never reach EOF (test_builds_fork_...) (may hang: timeout)
("Z58", Z, '            os.close(w)\n            w = None', '            w = None'),
# Z59 Forked: an interrupt during the request not handled (zygote kept, lock held) (test_an_interrupt_while_a_build_starts_or_ends_...)
("Z59", Z, '        except BaseException:  # (sent or not', '        except OSError:  # (sent or not'),
# Z60 Forked: a failed request neither kills the zygote nor lets the lock go (test_an_interrupt_while_a_build_starts_or_ends_...)
("Z60", Z, '            self._end(None)\n            raise', '            raise'),
# Z61 Forked.kill: SIGTERM, not SIGKILL (test_a_killed_build_ends_...: rc == -9)
("Z61", Z, '                os.kill(self.pid, signal.SIGKILL)', '                os.kill(self.pid, signal.SIGTERM)'),
# Z62 Forked.kill: kills the pid after the build's end was read (a reaped, maybe reused pid) (no test found)
("Z62", Z, '        if self.returncode is None and self.pid is not None:', '        if self.pid is not None:'),
# Z63 Forked.wait: a build whose zygote died reported 0 (test_a_zygote_killed_during_a_build_fails_that_build)
("Z63", Z, '                self._end(1)', '                self._end(0)'),
# Z64 Forked.wait: an interrupted wait leaves returncode None (test_an_interrupt_while_a_build_starts_or_ends_...: proc.wait() == -9)
("Z64", Z, '                self._end(-signal.SIGKILL)', '                self._end(None)'),
# Z65 Forked.wait: the zygote killed after every build (test_builds_fork_...: _ZYGOTE == [own_zygote])
("Z65", Z, '                self._end(code, keep=True)', '                self._end(code)'),
# Z66 Forked.wait: a second wait reads another reply (no test found: the interrupt test's second wait hits a closed file, still -9)
("Z66", Z, '        if self.returncode is None:\n            try:\n                code', '        if True:\n            try:\n                code'),
# Z67 Forked._end: the zygote's lock never let go (test_builds_fork_...: the second build runs alone)
("Z67", Z, '        finally:\n            self._release()', '        finally:\n            pass'),
# ---- _forks / _zygote ----
# Z68 _forks: _UNAVAILABLE ignored (a zygote started, and refused, for every build) (no test found: the poisoned zygote fails fast, the test's < 60 s holds)
("Z68", Z, '    return hasattr(os, "fork") and hasattr(socket, "send_fds") and not _UNAVAILABLE', '    return hasattr(os, "fork") and hasattr(socket, "send_fds")'),
# Z69 _zygote: a dead zygote not replaced (test_a_dead_zygote_is_replaced)
("Z69", Z, '    if _ZYGOTE and (_ZYGOTE[0].proc.poll() is not None or _ZYGOTE[0].env != _import_env(os.environ)):', '    if _ZYGOTE and _ZYGOTE[0].env != _import_env(os.environ):'),
# Z70 _zygote: a changed import-time environment not replaced (test_a_changed_import_time_variable_gets_a_fresh_zygote)
("Z70", Z, '    if _ZYGOTE and (_ZYGOTE[0].proc.poll() is not None or _ZYGOTE[0].env != _import_env(os.environ)):', '    if _ZYGOTE and _ZYGOTE[0].proc.poll() is not None:'),
# ---- prestart_builder / start_builder / _stop ----
# Z71 prestart_builder: waits for a running build's lock (not a no-op meanwhile) (no test found)
("Z71", Z, '    if _forks() and _LOCK.acquire(blocking=False):\n        try:\n            _zygote()', '    if _forks() and _LOCK.acquire():\n        try:\n            _zygote()'),
# Z72 start_builder: a second build waits for the first's lock (test_a_killed_build_ends_and_a_second_build_meanwhile_runs_alone) (may hang: timeout)
("Z72", Z, '    if _forks() and _LOCK.acquire(blocking=False):\n        held = True', '    if _forks() and _LOCK.acquire():\n        held = True'),
# Z73 start_builder: the zygote used without asking it is ready (test_a_zygote_that_cannot_serve_is_asked_once, test_a_zygote_killed_before_it_said_ready_...)
("Z73", Z, '            if z is not None and z.usable():', '            if z is not None:'),
# Z74 start_builder: the lock let go while a Forked build holds it (released twice: RuntimeError) (test_builds_fork_..., every Forked test)
("Z74", Z, '                held = False  #', '                pass  #'),
# Z75 _stop: zygotes closed, not killed (a running build outlives the exporting process's exit by up to 5 s) (no test found)
("Z75", Z, '    while _ZYGOTE:\n        _ZYGOTE[0].close(kill=True)', '    while _ZYGOTE:\n        _ZYGOTE[0].close()'),
# ---- session 89's fixes (after the first run) ----
# Z76 _die_with_parent: a zygote that ended before the death signal was asked for not noticed (the build runs on) (test_a_build_forked_after_its_zygote_ended_ends_at_once)
("Z76", Z, "        if os.getppid() != parent:\n            os.kill(os.getpid(), signal.SIGKILL)", "        pass"),
# Z77 Forked: no pipe: the zygote's lock kept (every later build alone) (test_a_build_with_no_pipe_runs_alone_and_the_zygote_serves_the_next)
("Z77", Z, "        except BaseException:  # (no pipe, out of descriptors: nothing was sent, the zygote serves the next build)\n            release()\n", "        except BaseException:  # (no pipe, out of descriptors: nothing was sent, the zygote serves the next build)\n            pass\n"),
]
