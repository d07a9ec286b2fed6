from ibtool.cli import main

code = main()
# `python -m ibtool`: CPython marks an exec() of a string that ended in KeyboardInterrupt as an
# unhandled Ctrl-C even when it was caught (Python/pythonrun.c run_eval_code_obj sets
# _PyRuntime.signals.unhandled_keyboard_interrupt), and after a module run Py_RunMain then exits
# by SIGINT instead of with the status main() returned (Modules/main.c). main() handles every
# Ctrl-C itself (exit 130, everything closed): a string exec that ends normally clears the mark.
exec("")  # noqa: S102
raise SystemExit(code)
