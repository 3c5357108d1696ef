"""`podrun --help`: the launcher's own flags, grouped, one line each.

absl's `--help` lists the flags of the main module (launcher/__main__.py
defines none) and `--helpfull` opens with absl's own; this lists the flags
of launcher/cli.py by what they are for. `--helpfull` still shows every flag.

Example:
  >>> print(usage.text(flags.FLAGS))
"""

from absl import flags

# Every flag of launcher/cli.py, in exactly one group (tests/test_cli.py),
# with one line of its own; the flag's help has the rest.
GROUPS = (
    ('What runs, and where it writes', (
        ('config', 'the job\'s config file; --config.FIELD=VALUE overrides'),
        ('workdir', 'where the job writes (default workdirs/<config>)'),
        ('local_devices', 'emulated CPU devices per process'),
        ('dry_run', 'print what each process would run; start nothing'),
        ('log_all_ranks', 'show every rank\'s INFO lines, not only rank 0\'s'),
    )),
    ('A local pod of processes on this machine', (
        ('local_processes', 'start and supervise N processes on 127.0.0.1'),
        ('coordinator_address', 'HOST:PORT of process 0 (a local pod: the '
         'port)'),
        ('kill_grace', 'seconds from the SIGINT that stops the ranks to '
         'SIGKILL'),
        ('preemption_grace', 'seconds to save after a preemption notice'),
    )),
    ('A process of a cluster (SLURM, mpirun, Kubernetes, or by hand)', (
        ('cluster', 'auto: join the cluster found, else run alone; none: '
         'alone'),
        ('num_processes', 'processes in the job (else detected)'),
        ('process_id', 'this process, in [0, num_processes)'),
        ('coordinator_bind_address', 'HOST:PORT process 0 listens on'),
        ('initialization_timeout', 'seconds for every process to join'),
    )),
    ('Who may join (docs/trust.md)', (
        ('tls', 'auto, require or off: mutual TLS on the coordinator'),
        ('tls_dir', 'the job\'s certificate authority (podrun-tls DIR)'),
    )),
    ('Supervision in every process', (
        ('supervision', 'failure broadcast, watchdog, stragglers, lease'),
        ('heartbeat_timeout', 'seconds of silence before a process is lost'),
        ('first_step_timeout', 'seconds for start-up and the first step'),
        ('stall_timeout', 'ceiling, in seconds, between two steps'),
        ('learned_stall_deadline', 'a deadline learned from the run\'s pace'),
        ('stall_floor', 'the shortest deadline it may learn, in seconds'),
        ('barrier_timeout', 'seconds any cross-process wait may take'),
        ('lease_timeout', 'seconds before a silent job\'s workdir lease '
         'lapses'),
        ('compilation_cache_dir', 'JAX\'s persistent compilation cache'),
    )),
    ('Restarts (a local pod)', (
        ('max_restarts', 'restart the job up to N times, resuming'),
        ('restart_backoff', 'seconds before a restart after no progress'),
        ('retry_exit_codes', 'exit codes to retry besides 75 (preempted)'),
        ('min_processes', 'elastic: go on with K or more after a lost one'),
        ('regrow_after', 'elastic: seconds until a lost process is back'),
    )),
)

HELP_ARGS = ('--help', '-help', '-h', '-?', '--helpshort', '-helpshort')

_HEAD = """\
podrun: run a JAX job on this machine, a local pod of processes, a cluster
or a Cloud TPU pod (scripts/launch_tpu_pod.sh).

  podrun --config=configs/linear_regression.py
  podrun --config=my_config.py --local_processes=2 --local_devices=4
  podrun --config=configs/mlp.py --config.steps=500 --workdir=/tmp/mlp

--config.FIELD=VALUE overrides any field of the config (runtime/config_base.py
lists them). --helpfull lists absl's own flags too.
"""


def _line(flag: flags.Flag, summary: str) -> str:
  if flag.boolean:
    name = f'--[no]{flag.name}'
    default = 'on' if flag.default else 'off'
  else:
    name = f'--{flag.name}'
    default = '' if flag.default in (None, []) else flag.default_as_str
  shown = f' (default {default.strip(chr(39))})' if default else ''
  return f'  {name:<30} {summary}{shown}'


def text(flag_values: flags.FlagValues) -> str:
  """The help: a few examples, then each group's flags, one line each."""
  out = [_HEAD]
  for title, entries in GROUPS:
    out.append(f'{title}:')
    out.extend(_line(flag_values[name], summary) for name, summary in entries)
    out.append('')
  return '\n'.join(out)
