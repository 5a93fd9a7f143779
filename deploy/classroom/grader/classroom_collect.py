"""nbgrader's collect for the class: a submission is collected only if it and every file in
it belong to the learner its name gives. nbgrader's own collect warns of a submission owned
by someone else ("cheating attempt?") and collects it anyway, so one learner's
`nbgrader submit --student=OTHER` would replace the other's work. Here such a forgery is
left in the exchange, named to the instructor in collect's log as an error, and the
learner's own latest submission is collected.
"""
import os
import pwd

from nbgrader.exchange.default.collect import ExchangeCollect

FORGED = "\0forged"  # no account name has it: a forgery groups with nothing else


def owners(path):
    """The account names owning ``path`` and everything under it."""
    uids = {os.lstat(path).st_uid}
    for root, dirs, files in os.walk(path):
        uids.update(os.lstat(os.path.join(root, name)).st_uid for name in dirs + files)
    names = set()
    for uid in uids:
        try:
            names.add(pwd.getpwuid(uid).pw_name)
        except KeyError:
            names.add(f"uid {uid}")
    return names


class OwnedCollect(ExchangeCollect):

    def _path_to_record(self, path):
        record = super()._path_to_record(path)
        found = owners(path)
        if found != {record["username"]}:
            self.forgeries.append((record["filename"], record["username"], sorted(found)))
            record["username"] = f"{FORGED}:{record['filename']}"
        return record

    def init_src(self):
        self.forgeries = []
        super().init_src()
        self.src_records = [r for r in self.src_records
                            if not r["username"].startswith(FORGED)]
        for filename, claimed, found in self.forgeries:
            self.log.error("FORGED SUBMISSION not collected: %s claims to be %s's but belongs "
                           "to %s", filename, claimed, ", ".join(found))
