"""The class's accounts: the grader's and the learners' (each a locked Unix account with a
home only it opens, a random password on a hand-out card), their removal, and ending their
processes (`classroom.py accounts`, `down`).
"""
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
from pathlib import Path

from kit import (
    KitError,
    disks,
    kit_module,
    load_learners,
    load_settings,
    record_account,
    recorded_accounts,
    run,
    secrets_folder,
    settings_path,
    user_exists,
    write_slurm_limit,
)

# Learners' passwords are read off a printed card: no characters that look alike.
CARD_ALPHABET = "abcdefghjkmnpqrstuvwxyzACDEFGHJKLMNPQRTUVWXY34679"
LEARNER_PASSWORD_LENGTH = 12


def add_account(state, name, home, comment):
    """A locked Unix account (no password: people log in through the hub) whose home only
    it can open."""
    if user_exists(name):
        if name not in recorded_accounts(state):
            raise KitError(f"an account named {name} already exists and is not this class's: "
                           f"choose another name (--prefix, --grader)")
        return
    run("useradd", "--create-home", "--home-dir", home, "--shell", "/bin/bash",
        "--user-group", "--comment", comment, "--key", "HOME_MODE=0700", name)
    record_account(state, name)
    # useradd follows login.defs (Debian's: umask 022, a world-readable home) unless told.
    home.chmod(0o700)


def learner_names(prefix, count):
    width = max(2, len(str(count)))
    return [f"{prefix}{i:0{width}d}" for i in range(1, count + 1)]


def command_accounts(args):
    state = args.state
    settings = load_settings(state)
    if args.action == "add":
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,20}", args.prefix):
            raise KitError(f"--prefix {args.prefix!r}: lower-case letters, digits and '-', "
                           f"starting with a letter, at most 21 characters")
        names = learner_names(args.prefix, args.count)
        own_disks = settings.get("home_bytes") and disks().problem() is None
        for name in names:
            add_account(state, name, state / "homes" / name, "ddp-workshop learner")
            if own_disks:  # a home of its own size (disks.py)
                try:
                    disks().make(state, name, state / "homes" / name, settings["home_bytes"])
                except OSError as error:
                    raise KitError(f"cannot give {name} a home filesystem ({error}): "
                                   f"`init --home-size 0` keeps plain folders") from None
        quota = settings.get("exchange_quota_bytes")
        if quota and disks().exchange_problem(state / "exchange") is None:
            for name in names:
                disks().limit_in_exchange(state / "exchange", name, quota)
        learners = sorted(set(load_learners(state)) | set(names))
        (state / "learners.txt").write_text("\n".join(learners) + "\n")
        write_slurm_limit(state, settings)
        made = set_learner_passwords(state, names)
        sheet = write_handout(state, settings)
        print(f"{len(names)} learner accounts: {names[0]} .. {names[-1]} (homes in "
              f"{state / 'homes'}; {len(made)} new passwords, the hand-out sheet {sheet}, "
              f"readable by root only); restart the hub to let new ones in (`serve` ends "
              f"the class accounts' processes before it starts the hub)")
    else:
        removed = remove_accounts(state, keep={settings["grader"]})
        (state / "learners.txt").unlink(missing_ok=True)
        write_slurm_limit(state, settings)
        passwords = learner_passwords(state)
        save_learner_passwords(state, {name: word for name, word in passwords.items()
                                       if name not in removed})
        write_handout(state, settings)
        print(f"removed {len(removed)} learner accounts")


def learner_passwords(state):
    """``{account: password}`` from DIR/secrets/learner_passwords (root's only)."""
    path = state / "secrets" / "learner_passwords"
    if not path.exists():
        return {}
    return dict(line.split(" ", 1) for line in path.read_text().splitlines() if line)


def save_learner_passwords(state, passwords):
    path = secrets_folder(state) / "learner_passwords"
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text("".join(f"{name} {word}\n" for name, word in sorted(passwords.items())))


def set_learner_passwords(state, names):
    """A random password for each of ``names`` that has none yet, set on the account with
    chpasswd (the hub checks it through PAM) and kept for the hand-out sheet."""
    passwords = learner_passwords(state)
    made = {name: "".join(secrets.choice(CARD_ALPHABET)
                          for _ in range(LEARNER_PASSWORD_LENGTH))
            for name in names if name not in passwords}
    if made:
        subprocess.run(["chpasswd"], input="".join(f"{n}:{w}\n" for n, w in made.items()),
                       text=True, capture_output=True, check=True)
        save_learner_passwords(state, {**passwords, **made})
    return made


def write_handout(state, settings):
    """DIR/secrets/handout.txt: one card per learner (address, account, password), cut
    along the lines and handed to each learner; root's only, like the passwords."""
    scheme = "https" if settings.get("ssl_cert") else "http"
    address = f"{scheme}://{settings['ip']}:{settings['port']}/"
    cut = "-" * 60
    cards = [f"{cut}\n  DDP workshop -- {address}\n  account:  {name}\n"
             f"  password: {word}\n  (yours alone: do not share it)\n"
             for name, word in learner_passwords(state).items()]
    path = secrets_folder(state) / "handout.txt"
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text("".join(cards) + (cut + "\n" if cards else ""))
    return path


def remove_accounts(state, keep=()):
    """Remove the accounts this kit created (and their homes), except ``keep``."""
    removed, kept = [], []
    for name in recorded_accounts(state):
        if name in keep:
            kept.append(name)
            continue
        if user_exists(name):
            # Processes left by the account (a server the hub did not stop) would keep
            # userdel from removing it, and its home filesystem from being unmounted.
            subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
            home = Path(pwd.getpwnam(name).pw_dir)
            try:
                disks().unmount(state, name, home)
            except OSError as error:
                raise KitError(f"cannot unmount {home}: {error}") from None
            run("userdel", "--remove", name)
        removed.append(name)
    (state / "accounts.txt").write_text("".join(f"{name}\n" for name in kept))
    return removed


def command_down(args):
    state = args.state
    removed = remove_accounts(state)
    print(f"removed {len(removed)} accounts ({', '.join(removed) or 'none'})")
    try:
        disks().unmount_exchange(state, state / "exchange")
    except OSError as error:
        raise KitError(f"cannot unmount {state / 'exchange'}: {error}") from None
    if settings_path(state).exists():
        left = kit_module("limits").remove_groups(load_settings(state).get("limits", {}))
        if left:
            print(f"control groups still in use, not removed: {', '.join(left)}")
    if args.purge:
        shutil.rmtree(state)
        print(f"removed {state}")


def process_uids(pid_folder):
    """The real, effective, saved and file-system uids of a process (its /proc folder's
    owner is not enough: a process that makes itself non-dumpable shows root's)."""
    fields = dict(line.split(":", 1) for line in (pid_folder / "status").read_text()
                  .splitlines() if ":" in line)
    if fields.get("State", "").split()[:1] in (["Z"], ["X"]):
        return set()  # ended already, waiting for its parent to read its status
    return {int(uid) for uid in fields.get("Uid", "").split()}


def end_processes_of_accounts(state):
    """End every process of the class's accounts (learners and grader) on this machine: none
    may hold an address of the hub's while it starts, nor outlive it. ``(account, count)``
    for each account that had any."""
    uids = {pwd.getpwnam(name).pw_uid: name for name in recorded_accounts(state)
            if user_exists(name)}
    counts, ended = {}, True
    for _ in range(50):  # again while any were found: one may have forked meanwhile
        if not ended:
            break
        ended = False
        for folder in Path("/proc").iterdir():
            try:
                owners = process_uids(folder) & set(uids) if folder.name.isdigit() else set()
                if owners:
                    os.kill(int(folder.name), signal.SIGKILL)
                    name = uids[owners.pop()]
                    counts[name], ended = counts.get(name, 0) + 1, True
            except (FileNotFoundError, ProcessLookupError):
                pass
    return sorted(counts.items())
