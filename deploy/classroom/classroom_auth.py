"""The class's login: one password for the learners, another for the instructors.

JupyterHub's SharedPasswordAuthenticator (5.3+) lets anybody with the class password log in
under any non-admin name, an instructor's too. Here the instructors' names take the
instructors' password only, so a learner who knows the class password still cannot become
an instructor (and reach the formgrader, which the instructors' group is given). Learners
can still log in under each other's names: that is what a shared password means (README.md
says when to configure another authenticator).
"""
from secrets import compare_digest

from jupyterhub.authenticators.shared import SharedPasswordAuthenticator
from traitlets import Set, Unicode, validate


class ClassroomAuthenticator(SharedPasswordAuthenticator):
    instructors = Set(Unicode(), config=True,
                      help="Names that log in with instructor_password, never user_password.")
    instructor_password = Unicode(
        None, allow_none=True, config=True,
        help="The instructors' password: at least 16 characters, not the class password.")

    @validate("instructor_password")
    def _validate_instructor_password(self, proposal):
        password = proposal.value
        if password and len(password) < 16:
            raise ValueError(f"instructor_password must be at least 16 characters, "
                             f"not {len(password)}")
        if password and password == self.user_password:
            raise ValueError("instructor_password and user_password must differ")
        return password

    async def authenticate(self, handler, data):
        name = self.normalize_username(data["username"])
        if name in self.instructors:
            if self.instructor_password and compare_digest(data["password"],
                                                           self.instructor_password):
                return {"name": name, "admin": False}
            return None
        return await super().authenticate(handler, data)
