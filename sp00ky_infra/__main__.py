from sp00ky_infra.cli.main import main

main()
