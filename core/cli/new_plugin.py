"""placeholder"""

def add_arguments(parser):
    pass


def run(args, console):
    raise NotImplementedError
