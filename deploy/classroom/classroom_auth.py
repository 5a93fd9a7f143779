"""The class's login: each learner account with its own password, checked by PAM (the
passwords `classroom.py accounts add` sets with chpasswd and prints on the hand-out sheet),
and the instructors, who have no Unix account here, with the instructors' password.

An instructor's name never goes to PAM and never takes a learner's password. A shared
class password (SharedPasswordAuthenticator's way: anybody with it logs in under any
learner's name) is used only where `init` was given --shared-class-password.
"""
from secrets import compare_digest

from jupyterhub.auth import PAMAuthenticator
from traitlets import Set, Unicode, validate


class ClassroomAuthenticator(PAMAuthenticator):
    instructors = Set(Unicode(), config=True,
                      help="Names that log in with instructor_password, never through PAM.")
    instructor_password = Unicode(
        None, allow_none=True, config=True,
        help="The instructors' password: at least 16 characters.")
    shared_password = Unicode(
        None, allow_none=True, config=True,
        help="INSECURE, opt-in: one password for every learner instead of their own.")

    @validate("instructor_password")
    def _validate_instructor_password(self, proposal):
        password = proposal.value
        if password and len(password) < 16:
            raise ValueError(f"instructor_password must be at least 16 characters, "
                             f"not {len(password)}")
        return password

    @validate("shared_password")
    def _validate_shared_password(self, proposal):
        password = proposal.value
        if password and password == self.instructor_password:
            raise ValueError("shared_password and instructor_password must differ")
        return password

    def system_user_exists(self, user):
        # Instructors are hub users only: no Unix account to find.
        return user.name in self.instructors or super().system_user_exists(user)

    async def authenticate(self, handler, data):
        name = self.normalize_username(data["username"])
        password = data.get("password") or ""
        if name in self.instructors:
            if self.instructor_password and compare_digest(password.encode(),
                                                           self.instructor_password.encode()):
                return {"name": name, "admin": False}
            return None
        if self.shared_password is not None:
            if password and compare_digest(password.encode(), self.shared_password.encode()):
                return {"name": name, "admin": False}
            return None
        return await super().authenticate(handler, data)
