def main(argv=None):
    print("fastar")
    return 0
