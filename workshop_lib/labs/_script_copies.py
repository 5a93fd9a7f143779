"""What counts as a copy of a script, for the debugging exercises of notebook 04
(``when_things_go_wrong``): the same code whatever its comments, docstrings and layout; and
whether a script still wraps its model in DDP."""
import ast
from pathlib import Path


def same_code(text, other):
    """Whether two scripts are the same code, whatever their comments, docstrings and
    layout."""
    try:
        return ast.dump(code_only(text)) == ast.dump(code_only(other))
    except SyntaxError:
        return False


def code_only(text):
    """The script's syntax tree without its docstrings or any other statement that is only a
    string: like comments, they change nothing the script does."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            kept = [statement for statement in body if not (
                isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
                and isinstance(statement.value.value, str))]
            node.body = kept or [ast.Pass()]
    return tree


def with_words_changed(path):
    """``path``'s script with its docstrings reworded and a comment added (a copy that
    changes only what the code says, not what it does); returns ``path``."""
    path = Path(path)
    text = path.read_text().replace('"""', '"""Reworded: ', 1)
    text = text.replace("    dist.init_process_group(", "    # set up the group\n"
                                                       "    dist.init_process_group(", 1)
    path.write_text(text.replace('"""[', '"""Reworded: [', 1))
    return path


def wraps_in_ddp(text):
    """Whether a script calls DistributedDataParallel (under that name, or as DDP)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return True  # let the launch report the syntax error, with its line
    names = {"DDP", "DistributedDataParallel"}
    return any(isinstance(node, ast.Call) and (
        isinstance(node.func, ast.Name) and node.func.id in names
        or isinstance(node.func, ast.Attribute) and node.func.attr in names)
        for node in ast.walk(tree))
